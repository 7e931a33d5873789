"""OpenEnv on orchard-async: an OpenEnv ``ContainerProvider`` whose container is an orchard
sandbox, on any adapter (local, docker, kubernetes, remote), network off by default.

    from openenv.core import GenericEnvClient
    from orchard_async.openenv import OrchardProvider

    provider = OrchardProvider("kubernetes", {"namespace": "envs"})
    env = await GenericEnvClient.from_docker_image("echo-env:latest", provider=provider)
    result = await env.reset()
    ...
    await env.close()  # stops the provider: the sandbox and everything in it

``start_container(image, port=8000, env_vars=None)`` creates a sandbox of ``image`` (its
environment ``env_vars``), starts the environment server in it with ``command`` (by default
what OpenEnv's images run: ``cd /app/env && uvicorn server.app:app --host 0.0.0.0 --port
PORT``), and answers ``sandbox.expose(port)``: a URL on this machine's loopback whose
connections go through the library's ``connect`` into the sandbox. So the server needs no
network at all, and OpenEnv's clients (HTTP and the ``/ws`` WebSocket) use the URL as they
would a container's. ``files`` are written into the sandbox's working directory first (an
environment's code, for an image that lacks it).

OpenEnv calls a provider synchronously, from inside its own event loop (``from_docker_image``
is a coroutine that calls ``start_container`` without awaiting). The provider therefore keeps
its adapter, its sandbox and the exposure's listener on an event loop of its own, in a thread
(anyio's blocking portal), which the URL reaches over TCP like any client.

Needs ``openenv-core`` (``pip install 'orchard-async[openenv]'``).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import httpx

import orchard_async as oa
from orchard_async.capabilities import Exposes

try:
    from openenv.core.containers.runtime.providers import ContainerProvider
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        f"orchard_async.openenv needs openenv-core: pip install 'orchard-async[openenv]' ({exc})"
    ) from exc

T = TypeVar("T")
DEFAULT_PORT = 8000  # where OpenEnv's images serve
# What OpenEnv's images run (their Dockerfile's CMD); ``{port}`` is the port inside the sandbox.
DEFAULT_COMMAND = "cd /app/env && uvicorn server.app:app --host 0.0.0.0 --port {port}"
SERVER_LOG = "/tmp/openenv-server.log"
LOG_TAIL = 2000  # characters of the server's log in a readiness error


class OrchardProvider(ContainerProvider):
    """An OpenEnv environment server in an orchard sandbox (see the module docstring).

    ``adapter`` and ``adapter_options`` as ``get_adapter`` takes them; ``spec`` fields
    (``cpu``, ``memory``, ``ttl``, ``network``...) for every sandbox it makes, ``network``
    ``"none"`` unless given; ``command`` the server's start command (``{port}`` filled in).
    One sandbox at a time, as OpenEnv's providers manage one container."""

    def __init__(
        self,
        adapter: str = "local",
        adapter_options: dict[str, Any] | None = None,
        *,
        command: str = DEFAULT_COMMAND,
        files: dict[str, str | bytes] | None = None,
        **spec: Any,
    ):
        self.adapter_name = adapter
        self.adapter_options = dict(adapter_options or {})
        self.command = command
        self.files = dict(files or {})
        self.spec = {"network": "none", **spec}
        oa.SandboxSpec(**self.spec)  # a bad field is the constructor's ConfigError, not start's
        self._portal_context: AbstractContextManager[anyio.from_thread.BlockingPortal] | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._adapter: oa.Adapter | None = None
        self.sandbox: oa.Sandbox | None = None
        self.base_url: str | None = None

    # -- ContainerProvider ----------------------------------------------------------------------

    def start_container(
        self, image: str, port: int | None = None, env_vars: dict[str, str] | None = None, **kwargs: Any
    ) -> str:
        """A sandbox of ``image`` running the server on ``port`` inside it (default 8000);
        the URL that reaches it. ``kwargs``: ``command`` and ``files`` for this start."""
        if self.sandbox is not None:
            raise RuntimeError("this provider already runs a sandbox: stop_container() first")
        unknown = set(kwargs) - {"command", "files"}
        if unknown:
            raise oa.ConfigError(f"OrchardProvider.start_container takes command and files, not {sorted(unknown)}")
        self._portal_context = anyio.from_thread.start_blocking_portal(backend="asyncio")
        self._portal = self._portal_context.__enter__()
        try:
            self.base_url = self._portal.call(
                self._start,
                image,
                port or DEFAULT_PORT,
                env_vars or {},
                kwargs.get("command", self.command),
                {**self.files, **kwargs.get("files", {})},
            )
        except BaseException:
            self.stop_container()
            raise
        return self.base_url

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        """Until ``GET /health`` answers 200 (OpenEnv's servers have it); ``TimeoutError``
        with the end of the server's log otherwise."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0) as http:
            while time.monotonic() < deadline:
                try:
                    if http.get(f"{base_url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise TimeoutError(
            f"the OpenEnv server did not answer {base_url}/health within {timeout_s:g}s; {self._log_tail()}"
        )

    def stop_container(self) -> None:
        """Close the sandbox (the server, the exposure and everything else in it) and the
        adapter; the provider can start again."""
        portal, context = self._portal, self._portal_context
        self._portal = self._portal_context = None
        if portal is not None:
            try:
                portal.call(self._stop)
            finally:
                assert context is not None
                context.__exit__(None, None, None)
        self.base_url = None

    def call(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await function(*args)`` on the provider's loop, where its sandbox lives (from a
        thread that is not that loop's: ``provider.call(provider.sandbox.exec, "ls")``)."""
        if self._portal is None:
            raise RuntimeError("the provider runs no sandbox: start_container() first")
        return self._portal.call(function, *args)

    # -- on the provider's own loop -----------------------------------------------------------

    async def _start(self, image: str, port: int, env: dict[str, str], command: str, files: dict[str, Any]) -> str:
        self._adapter = oa.get_adapter(self.adapter_name, **self.adapter_options)
        self.sandbox = await self._adapter.create(oa.SandboxSpec(**{**self.spec, "image": image, "env": env}))
        for path, content in files.items():
            await self.sandbox.write_file(path, content)
        started = await self.sandbox.exec(
            f"nohup sh -c {shlex.quote(command.replace('{port}', str(port)))} >{SERVER_LOG} 2>&1 </dev/null &",
            timeout=60,
        )
        if not started.ok:
            raise RuntimeError(f"the OpenEnv server did not start in {self.sandbox.id}: {started.error_text.strip()}")
        if not isinstance(self.sandbox, Exposes):
            raise oa.ConfigError(f"the {self.adapter_name} adapter's sandboxes cannot expose a port")
        return await self.sandbox.expose(port)

    async def _stop(self) -> None:
        sandbox, adapter = self.sandbox, self._adapter
        self.sandbox = self._adapter = None
        if sandbox is not None:
            await sandbox.close()
        if adapter is not None:
            await adapter.close()

    def _log_tail(self) -> str:
        if self._portal is None or self.sandbox is None:
            return "no sandbox"
        sandbox = self.sandbox
        try:
            log = self._portal.call(sandbox.read_file, SERVER_LOG).decode(errors="replace")
        except (OSError, oa.OrchardError) as exc:
            return f"its log could not be read ({exc})"
        return f"the server's log ends: {log[-LOG_TAIL:].strip() or '(empty)'}"

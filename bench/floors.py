"""Baselines measured in the same run as the adapter: floors and peers.

A *floor* is the cheapest way to run one command on the adapter's backend without
orchard-async (a bare process spawn for ``local``; ``docker exec`` and a fresh Docker API
exec for ``docker``). A *peer* is another project's runtime doing the same job
(SWE-ReX's local runtime). Both are registries keyed by name, so a new adapter needs
no benchmark code beyond (optionally) one entry here; an adapter with no floor is
measured alone, with a note saying so.

Each entry is an async context manager factory ``open(ctx, loops)`` that yields one
``Op`` per loop (the same op may be shared), and an ``available(ctx)`` that returns
``None`` or the reason it cannot run here.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from orchard_async.bench.common import Op

DOCKER_CALL_TIMEOUT = 60.0  # every daemon call is bounded: dockerd has been seen to deadlock
DEFAULT_DOCKER_IMAGE = "orchard/busybox:test"


@dataclass
class Context:
    adapter_name: str
    adapter_options: dict[str, Any]
    command: str = "true"
    image: str | None = None

    @property
    def docker_image(self) -> str:
        return self.image or str(self.adapter_options.get("image") or DEFAULT_DOCKER_IMAGE)


@dataclass
class Baseline:
    name: str  # row subject: "floor:spawn", "peer:swe-rex"
    what: str  # one line for the notes and the README
    open: Callable[[Context, int], AbstractAsyncContextManager[list[Op]]]
    available: Callable[[Context], str | None] = lambda ctx: None
    max_concurrency: int | None = None  # measured only up to here (e.g. a blocking peer)
    per_loop: int | None = None  # at most this many ops per loop (a slow peer would take minutes)
    max_ops: int | None = None  # at most this many ops per level (at least one per loop)
    notes: list[str] = field(default_factory=list)


# -- local -------------------------------------------------------------------------------


def _argv(command: str) -> list[str]:
    """``true`` runs as itself (the floor is one process); anything else through ``sh -c``."""
    return ["true"] if command == "true" else ["sh", "-c", command]


@asynccontextmanager
async def _spawn(ctx: Context, loops: int) -> AsyncIterator[list[Op]]:
    argv = ["/bin/true"] if ctx.command == "true" else _argv(ctx.command)

    async def op() -> None:
        process = await asyncio.create_subprocess_exec(*argv)
        await process.wait()

    yield [op] * loops


# -- docker ------------------------------------------------------------------------------


def _docker_available(ctx: Context) -> str | None:
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        done = subprocess.run(["docker", "image", "inspect", ctx.docker_image], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker did not answer: {exc}"
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        return f"docker image {ctx.docker_image} is not available here ({message[-1] if message else 'no daemon?'})"
    return None


async def _docker(*args: str) -> bytes:
    process = await asyncio.create_subprocess_exec(
        "docker", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        with anyio.fail_after(DOCKER_CALL_TIMEOUT):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"docker {args[0]} failed: {err.decode(errors='replace').strip()}")
    return out


@asynccontextmanager
async def _floor_container(ctx: Context) -> AsyncIterator[str]:
    """One container for the floor's commands (exec cost does not depend on how many
    containers share the daemon's exec path), removed at the end whatever happens."""
    name = f"orchard-bench-floor-{uuid.uuid4().hex[:8]}"
    out = await _docker(
        "run",
        "-d",
        "--rm",
        "--network",
        "none",
        "--name",
        name,
        "--label",
        "orchard.bench=floor",
        ctx.docker_image,
        "sleep",
        "3600",
    )
    container_id = out.decode().strip()
    try:
        yield container_id
    finally:
        with anyio.CancelScope(shield=True):
            await _docker("rm", "-f", container_id)


@asynccontextmanager
async def _docker_cli(ctx: Context, loops: int) -> AsyncIterator[list[Op]]:
    async with _floor_container(ctx) as container_id:
        argv = ["docker", "exec", container_id, *_argv(ctx.command)]

        async def op() -> None:
            process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL)
            with anyio.fail_after(DOCKER_CALL_TIMEOUT):
                await process.wait()

        yield [op] * loops


def _aiodocker_available(ctx: Context) -> str | None:
    if importlib.util.find_spec("aiodocker") is None:
        return "aiodocker is not installed (pip install 'orchard-async[docker]')"
    return _docker_available(ctx)


@asynccontextmanager
async def _aiodocker_exec(ctx: Context, loops: int) -> AsyncIterator[list[Op]]:
    import aiodocker

    async with _floor_container(ctx) as container_id:
        client = aiodocker.Docker()
        try:
            container = client.containers.container(container_id)

            async def op() -> None:
                with anyio.fail_after(DOCKER_CALL_TIMEOUT):
                    execution = await container.exec(_argv(ctx.command), stdout=True, stderr=True)
                    async with execution.start(detach=False) as stream:
                        while await stream.read_out() is not None:
                            pass
                    await execution.inspect()  # the exit code, as a caller must fetch it

            yield [op] * loops
        finally:
            await client.close()


# -- kubernetes ----------------------------------------------------------------------------


def _kubernetes_available(ctx: Context) -> str | None:
    if importlib.util.find_spec("kubernetes_asyncio") is None:
        return "kubernetes-asyncio is not installed (pip install 'orchard-async[kubernetes]')"
    return None


def _kubeconfig_path(options: dict[str, Any]) -> str | None:
    """The kubeconfig to load, or None for the in-cluster service account."""
    path = options.get("kubeconfig") or os.environ.get("KUBECONFIG")
    default = os.path.expanduser("~/.kube/config")
    if options.get("in_cluster") or not (path or os.path.exists(default)):
        return None
    return path or default


async def _kubernetes_configuration(options: dict[str, Any]) -> Any:
    """The cluster configuration for the same adapter options (``kubeconfig``, ``context``,
    ``in_cluster``), found as kubectl finds it: KUBECONFIG, ~/.kube/config, in-cluster."""
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio import config as k8s_config

    configuration = k8s.Configuration()
    path = _kubeconfig_path(options)
    if path is None:
        k8s_config.load_incluster_config(client_configuration=configuration)
    else:
        await k8s_config.load_kube_config(
            config_file=path, context=options.get("context"), client_configuration=configuration, persist_config=False
        )
    configuration.connection_pool_maxsize = 0  # one websocket per loop at once: no pool limit (aiohttp: 0)
    return configuration


def _kubernetes_namespace(options: dict[str, Any]) -> str:
    """Where the adapter puts its pods, as its options document it."""
    return options.get("namespace") or os.environ.get("ORCHARD_K8S_NAMESPACE") or "orchard"


@asynccontextmanager
async def _kubernetes_exec(ctx: Context, loops: int) -> AsyncIterator[list[Op]]:
    """A fresh exec websocket per command (connect, run, read the status channel, close)
    through the API server with kubernetes-asyncio alone, on pods made by the adapter:
    what a client without a persistent session pays."""
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio.stream import WsApiClient

    from orchard_async import SandboxSpec, get_adapter

    adapter = get_adapter("kubernetes", **ctx.adapter_options)
    namespace = _kubernetes_namespace(ctx.adapter_options)
    boxes: list[Any] = []
    ws_client: Any = None
    try:

        async def one() -> None:
            boxes.append(await adapter.create(SandboxSpec(ttl=900, image=ctx.image)))

        async with anyio.create_task_group() as group:
            for _ in range(loops):
                group.start_soon(one)
        ws_client = WsApiClient(configuration=await _kubernetes_configuration(ctx.adapter_options))
        core = k8s.CoreV1Api(ws_client)
        argv = _argv(ctx.command)

        def make(pod: str) -> Op:
            async def op() -> None:
                status = ""
                with anyio.fail_after(DOCKER_CALL_TIMEOUT):
                    connecting = await core.connect_get_namespaced_pod_exec(
                        pod, namespace, command=argv, stdout=True, stderr=True, tty=False, _preload_content=False
                    )
                    async with connecting as ws:
                        async for message in ws:  # a channel byte, then data; channel 3: the final status
                            data = message.data
                            if isinstance(data, str):
                                data = data.encode()
                            if isinstance(data, bytes) and data[:1] == b"\x03":
                                status = data[1:].decode(errors="replace")
                if '"Success"' not in status:  # {"status": "Success"}, or a Failure naming the exit code
                    raise RuntimeError(f"exec in pod {pod} failed: {status[-200:] or 'no status'!r}")

            return op

        yield [make(box.id) for box in boxes]
    finally:
        with anyio.CancelScope(shield=True):
            if ws_client is not None:
                await ws_client.close()
            await adapter.close()


# -- peers -------------------------------------------------------------------------------


def _swerex_available(ctx: Context) -> str | None:
    if importlib.util.find_spec("swerex") is None:
        return "swe-rex is not installed (pip install swe-rex)"
    return None


@asynccontextmanager
async def _swerex(ctx: Context, loops: int) -> AsyncIterator[list[Op]]:
    """SWE-ReX's LocalRuntime: one persistent bash session per loop (pexpect underneath),
    commands sent with ``run_in_session``, the way SWE-agent drives it."""
    from swerex.runtime.abstract import BashAction, CloseBashSessionRequest, CreateBashSessionRequest
    from swerex.runtime.local import LocalRuntime

    runtime = LocalRuntime()
    names = [f"bench{i}" for i in range(loops)]
    try:
        for name in names:
            await runtime.create_session(CreateBashSessionRequest(session=name, startup_timeout=30))

        def make(name: str) -> Op:
            action = BashAction(command=ctx.command, session=name, timeout=60, check="silent")
            return lambda: runtime.run_in_session(action)

        yield [make(name) for name in names]
    finally:
        for name in names:
            try:
                await runtime.close_session(CloseBashSessionRequest(session=name))
            except Exception:  # noqa: BLE001 - a session that never started
                pass
        await runtime.close()


FLOORS: dict[str, list[Baseline]] = {
    "local": [Baseline("floor:spawn", "a bare asyncio.create_subprocess_exec('/bin/true') and wait", _spawn)],
    "docker": [
        Baseline(
            "floor:docker-exec",
            "`docker exec CONTAINER true` through the CLI, one process per command",
            _docker_cli,
            _docker_available,
            max_ops=200,
        ),
        Baseline(
            "floor:aiodocker-exec",
            "a fresh Docker API exec per command via aiodocker (create, attach-start, inspect)",
            _aiodocker_exec,
            _aiodocker_available,
            max_ops=200,
        ),
    ],
    "kubernetes": [
        Baseline(
            "floor:fresh-exec-ws",
            "a fresh exec websocket per command through the API server (kubernetes-asyncio WsApiClient)",
            _kubernetes_exec,
            _kubernetes_available,
            max_ops=200,
        ),
    ],
}

PEERS: list[Baseline] = [
    Baseline(
        "peer:swe-rex",
        "SWE-ReX LocalRuntime.run_in_session in a persistent bash session (pexpect)",
        _swerex,
        _swerex_available,
        # Its async methods block the event loop (pexpect and time.sleep inside), so
        # concurrent sessions in one process only queue up: measured at concurrency 1.
        max_concurrency=1,
        per_loop=50,
    ),
]

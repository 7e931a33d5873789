"""The Docker daemon as the docker adapter uses it: one aiodocker client, every call under a
timeout, and the calls the adapter and its satellites make (images, containers, execs and
their attach streams). A daemon that stalls or cannot be reached is ``BackendUnavailable``;
HTTP errors (``aiodocker.DockerError``) are left to the caller, which knows what a 404 or a
409 means for what it was doing."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable
from typing import Any, TypeVar

import aiodocker
import aiohttp
import anyio
import yarl
from aiodocker.containers import DockerContainer
from aiodocker.stream import Stream
from aiodocker.types import SENTINEL

from orchard_async.errors import BackendUnavailable, CreateFailed
from orchard_async.images import ImageMissing, missing_image_hint

T = TypeVar("T")

WHERE = "the Docker daemon"

PULL_TIMEOUT = 600.0
INTERRUPT_TIMEOUT = 5.0  # signalling a timed-out command
DESTROY_TIMEOUT = 20.0


class AttachConnection:
    """An aiodocker exec attach stream as the container shell's ExecConnection."""

    def __init__(self, stream: Stream):
        self._stream = stream

    async def read(self) -> tuple[int, bytes] | None:
        message = await self._stream.read_out()
        return None if message is None else (message.stream, message.data)

    async def write(self, data: bytes) -> None:
        # aiodocker's write has no timeout (the stream bounds it) and fails with
        # AssertionError or RuntimeError once the connection is gone.
        await self._stream.write_in(data)

    def write_eof(self) -> None:
        """Half-close the connection: the daemon closes the process's stdin (as ``docker
        exec -i`` does at the end of its input). aiodocker has no call for it, so this
        reaches its connection's transport."""
        response = getattr(self._stream, "_resp", None)  # aiodocker's private member: absent in another version
        transport = response.connection.transport if response is not None and response.connection else None
        if transport is None or not transport.can_write_eof():
            raise anyio.BrokenResourceError("the exec stream is gone")
        transport.write_eof()

    async def close(self) -> None:
        await self._stream.close()


class DockerApi:
    """One daemon (``url``, else what aiodocker finds), reached by one client made on first
    use; ``timeout`` bounds any single call unless the call names its own limit."""

    def __init__(self, url: str | None, timeout: float):
        self.url = url
        self.timeout = timeout
        self.endpoint = url or "the default Docker socket"  # the socket's path once connected
        # False once the client speaks tcp/ssh/tls: the daemon may be on another machine and
        # cannot bind this machine's files into a container
        self.same_host = True
        # Event-loop objects are made on first use: the constructor may run outside a loop.
        self._docker: aiodocker.Docker | None = None
        self._connecting: anyio.Lock | None = None

    async def client(self) -> aiodocker.Docker:
        if self._docker is None:
            # Concurrent first calls must share one client: connecting awaits.
            self._connecting = self._connecting or anyio.Lock()
            async with self._connecting:
                if self._docker is None:
                    self._docker = await self._connect()
        return self._docker

    async def _connect(self) -> aiodocker.Docker:
        """aiodocker's client, with an unbounded connection pool on unix sockets: each live
        sandbox holds one connection (its exec stream), and aiohttp's default pool of 100
        would make the 101st sandbox wait forever."""
        timeout = aiohttp.ClientTimeout(sock_connect=10)
        try:
            docker = aiodocker.Docker(url=self.url, timeout=timeout)
        except AssertionError:  # aiodocker's way to say it found no socket (the daemon is restarting, or absent)
            raise self.unreachable("connect", "no Docker socket found") from None
        if not isinstance(docker.connector, aiohttp.UnixConnector):
            self.same_host = False
            return docker  # tcp/ssh/tls: aiodocker's pool (at most ~100 live sandboxes)
        path = docker.connector.path
        await docker.close()
        self.endpoint = f"unix://{path}"
        # The client does not close a connector it was given (see close).
        return aiodocker.Docker(
            url="unix://localhost",  # aiodocker's placeholder host for socket URLs
            connector=aiohttp.UnixConnector(path=path, limit=0),
            timeout=timeout,
        )

    async def close(self) -> None:
        """Drop the client (and its connections); the next call makes a new one."""
        docker, self._docker = self._docker, None
        if docker is not None:
            await docker.close()
            await docker.connector.close()  # a no-op when aiodocker already closed its own

    async def call(self, what: str, call: Awaitable[T], limit: float | None = None) -> T:
        """One daemon call under a timeout; an unreachable or stalled daemon becomes
        BackendUnavailable. HTTP errors (aiodocker.DockerError) are left to the caller."""
        limit = limit or self.timeout
        try:
            with anyio.fail_after(limit):
                return await call
        except TimeoutError:
            raise BackendUnavailable(
                f"the Docker daemon at {self.endpoint} did not answer {what} within {limit:.0f}s "
                "(if it stays so, `orchard-async doctor` says whether its version can deadlock)"
            ) from None
        except aiodocker.DockerError as exc:
            if exc.status == 900:  # aiodocker's code for "could not connect"
                raise self.unreachable(what, exc.message) from None
            raise
        except (aiohttp.ClientError, OSError) as exc:
            raise self.unreachable(what, str(exc) or type(exc).__name__) from None

    def unreachable(self, what: str, why: str) -> BackendUnavailable:
        return BackendUnavailable(
            f"cannot reach the Docker daemon at {self.endpoint} ({what}): {why}; "
            "start it (scripts/docker-up.sh here) or point DOCKER_HOST at it"
        )

    # -- images ---------------------------------------------------------------------------------

    async def version(self) -> dict[str, Any]:
        return await self.call("version", (await self.client()).version(), 10)

    async def info(self) -> dict[str, Any]:
        """The daemon's ``docker info``: its CPUs, memory, runtimes, devices."""
        return dict(await self.call("info", (await self.client()).system.info(), 10))

    async def image_present(self, image: str) -> bool:
        docker = await self.client()
        try:
            await self.call(f"inspect of image {image}", docker.images.inspect(image))
        except aiodocker.DockerError as exc:
            if exc.status == 404:
                return False
            raise CreateFailed(f"inspecting image {image!r} failed: {exc}") from None
        return True

    async def pull(self, image: str) -> None:
        docker = await self.client()
        try:
            await self.call(f"pull of {image}", docker.images.pull(image), PULL_TIMEOUT)
        except aiodocker.DockerError as exc:
            raise ImageMissing(
                f"image {image} is not on {WHERE} and could not be pulled ({exc.message.strip()}); "
                f"{missing_image_hint(image, WHERE)}"
            ) from None

    # -- containers -----------------------------------------------------------------------------

    async def container(self, name: str) -> DockerContainer:
        """A handle on a container by name (no call: whether it exists is the next call's answer)."""
        return (await self.client()).containers.container(name)

    async def create_container(self, name: str, config: dict[str, Any]) -> DockerContainer:
        docker = await self.client()
        return await self.call("container create", docker.containers.create(config, name=name))

    async def list_containers(self, labels: list[str]) -> list[DockerContainer]:
        """Containers (running or not) carrying every one of ``labels`` (``key`` or ``key=value``):
        entries of the list endpoint (``Names``, ``Labels``, ``State``)."""
        docker = await self.client()
        filters = json.dumps({"label": labels})  # aiodocker passes a container list's filters as they are
        return await self.call("container list", docker.containers.list(all=True, filters=filters))

    async def remove_container(self, name: str) -> None:
        """Force-remove a container; return once the daemon confirms it is gone."""
        container = await self.container(name)
        try:
            await self.call(f"removal of {name}", container.delete(force=True), DESTROY_TIMEOUT)
            return
        except aiodocker.DockerError as exc:
            if exc.status == 404:  # already gone: AutoRemove won the race
                return
            if exc.status != 409:
                raise
        # 409: a removal is already under way (AutoRemove's): wait for it to finish.
        try:
            await self.call(f"wait for removal of {name}", container.wait(condition="removed"), DESTROY_TIMEOUT)
        except aiodocker.DockerError as exc:
            if exc.status != 404:
                raise

    async def interrupt(self, container: DockerContainer) -> None:
        """SIGUSR1 to the container's main process (its timer relays it to the shell: see
        container.TIMER). Never raises: a signal the daemon cannot deliver in time is the
        shell client's grace period to judge."""
        with contextlib.suppress(BackendUnavailable, aiodocker.DockerError):
            await self.call("interrupt", container.kill(signal="SIGUSR1"), INTERRUPT_TIMEOUT)

    # -- attach streams -------------------------------------------------------------------------

    async def attach_main(self, container: DockerContainer, *, output: bool = True) -> AttachConnection:
        """Attach to the main process's stdin, and its stdout and stderr unless ``output`` is
        False (aiodocker's ``attach`` would first inspect the container for its tty setting: it
        has none). Made before the start of a container with StdinOnce, the connection is the
        container's stdin: the daemon closes that when the connection goes."""
        docker = await self.client()

        async def setup() -> tuple[yarl.URL, None, bool]:
            query: dict[str, str | int] = {
                "stream": 1,
                "stdin": 1,
                "stdout": int(output),
                "stderr": int(output),
                "logs": 0,
                "detachKeys": "",
            }
            return yarl.URL(f"containers/{container.id}/attach").with_query(query), None, False

        stream = Stream(docker, setup, docker._resolve_long_running_timeout(SENTINEL))
        await self.call("container attach", stream.__aenter__())  # upgrades the HTTP connection
        return AttachConnection(stream)

    async def attach_exec(
        self, container: DockerContainer, command: list[str], what: str, *, stdin: bool
    ) -> AttachConnection:
        """Create and start an exec, attached (stdout and stderr; stdin when asked).
        CreateFailed when the daemon refuses it (the container is gone, or stopping)."""
        try:
            execution = await self.call(
                f"{what} exec create", container.exec(command, stdin=stdin, stdout=True, stderr=True, tty=False)
            )
            attach = execution.start(detach=False)
            await self.call(f"{what} exec start", attach.__aenter__())  # upgrades the HTTP connection
        except aiodocker.DockerError as exc:
            raise CreateFailed(f"could not start the sandbox {what}: {exc.message}") from None
        return AttachConnection(attach)

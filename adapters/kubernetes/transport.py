"""How the adapter reaches a pod: a ``Transport``. The default, ``ExecTransport``, is the
API server's exec websocket (kubernetes-asyncio ``WsApiClient``, channel protocol v4: a
leading byte names the stream, 0 stdin, 1 stdout, 2 stderr, 3 status); its websockets
become the container shell's streams (orchard_async.kit.container_shell): the shell, the
output relays, and ``open_stream``. The relay in the pod reached over the pod IP
(``podip.PodIpTransport``) is the alternative, with this one as its fallback."""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Protocol, runtime_checkable

import aiohttp
import anyio
import anyio.abc
import msgspec
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.stream import WsApiClient

from orchard_async.adapters.kubernetes.api import API_TIMEOUT
from orchard_async.adapters.kubernetes.manifests import CONTAINER
from orchard_async.errors import BackendUnavailable, CreateFailed
from orchard_async.kit.background import Background
from orchard_async.kit.exec_streams import DuplexStream, ExecStream, OutputStream

SEND_CHUNK = 256 * 1024  # stdin bytes per websocket message


class PodRef(msgspec.Struct, frozen=True):
    namespace: str
    name: str
    ip: str | None = None  # for transports that reach an agent in the pod directly (podip)
    secret: str | None = None  # what that agent accepts (relay); never in a repr
    image: str = ""  # the pod's image: podip remembers images without the agent

    def __repr__(self) -> str:
        return f"PodRef({self.namespace!r}, {self.name!r}, ip={self.ip!r}, image={self.image!r})"


class Transport(Protocol):
    """How the adapter reaches a pod: a byte stream to a shell for the shell-session
    protocol, and one-shot commands (the timeout interrupt). ``start`` is given the
    adapter's background (orchard_async.kit.background), where a stream's reader task runs."""

    name: str

    async def start(self, configuration: k8s.Configuration, background: Background) -> None: ...

    async def open_shell(self, pod: PodRef, command: list[str]) -> anyio.abc.ByteStream: ...

    async def run(self, pod: PodRef, command: list[str], timeout: float) -> tuple[int | None, bytes, bytes]: ...

    async def close(self) -> None: ...


# What a transport may offer besides (both of ours offer the first two; the adapter asks with isinstance).


@runtime_checkable
class Outputs(Protocol):
    """The stdout of a command, read on demand (the output relays). A transport without it
    runs the shell protocol in spool mode (output in files in the pod)."""

    async def open_output(self, pod: PodRef, command: list[str]) -> OutputStream: ...


@runtime_checkable
class Streams(Protocol):
    """stdin and stdout of a command, read on demand (``Sandbox.open_stream``). A transport
    without it has no streams into its pods."""

    async def open_stream(self, pod: PodRef, command: list[str]) -> anyio.abc.ByteStream: ...


@runtime_checkable
class PodRelays(Protocol):
    """A transport that reaches a relay in each pod: the adapter puts one there, listening on
    ``relay_port`` with a secret, and tells the transport when a pod is gone (``forget``)."""

    relay_port: int

    def forget(self, pod: PodRef) -> None: ...


class WebSocketConnection:
    """One exec websocket as the container shell's ExecConnection."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self._ws = ws

    async def read(self) -> tuple[int, bytes] | None:
        while True:
            message = await self._ws.receive()
            if message.type == aiohttp.WSMsgType.BINARY:
                data = message.data
            elif message.type == aiohttp.WSMsgType.TEXT:
                data = message.data.encode()
            else:
                return None  # closed, or an error: the end of the stream
            if len(data) >= 2:  # shorter: the empty per-channel greeting
                return data[0], data[1:]

    async def write(self, data: bytes) -> None:
        if self._ws.closed:
            raise anyio.BrokenResourceError("the exec websocket is closed")
        for start in range(0, len(data), SEND_CHUNK):
            await self._ws.send_bytes(b"\x00" + data[start : start + SEND_CHUNK])

    def write_eof(self) -> None:
        raise NotImplementedError("the kubernetes exec protocol (v4) cannot close a process's stdin alone")

    async def close(self) -> None:
        await self._ws.close()


class ExecTransport:
    """The API server's exec websocket (kubernetes-asyncio ``WsApiClient``)."""

    name = "exec"

    def __init__(self, *, heartbeat: float | None = 30.0, connect_timeout: float = API_TIMEOUT):
        self.heartbeat = heartbeat
        self.connect_timeout = connect_timeout
        self._client: WsApiClient | None = None
        self._connector_session: aiohttp.ClientSession | None = None
        self._core: k8s.CoreV1Api | None = None
        self._background: Background | None = None

    async def start(self, configuration: k8s.Configuration, background: Background) -> None:
        self._background = background
        ws_config = copy.copy(configuration)
        # each live sandbox holds one connection: no pool limit (aiohttp: 0 = unlimited)
        ws_config.connection_pool_maxsize = 0
        self._client = WsApiClient(configuration=ws_config, heartbeat=self.heartbeat)
        # The client's aiohttp session carries aiohttp's default 5-minute total timeout; a
        # shell's websocket must live for the sandbox's whole TTL, so its session has none
        # (same connector). Liveness is the heartbeat's job: a ping every `heartbeat` s, and
        # a missing pong closes the stream (the sandbox then reads as lost).
        rest = self._client.rest_client
        self._connector_session = rest.pool_manager
        rest.pool_manager = aiohttp.ClientSession(
            connector=self._connector_session.connector,
            connector_owner=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
            trust_env=True,
        )
        self._core = k8s.CoreV1Api(self._client)

    async def _connect(
        self, pod: PodRef, command: list[str], stdin: bool, container: str = CONTAINER
    ) -> WebSocketConnection:
        assert self._core is not None, "transport not started"
        try:
            with anyio.fail_after(self.connect_timeout):
                context = await self._core.connect_get_namespaced_pod_exec(
                    pod.name,
                    pod.namespace,
                    container=container,
                    command=command,
                    stdin=stdin,
                    stdout=True,
                    stderr=True,
                    tty=False,
                    _preload_content=False,
                )
                return WebSocketConnection(await context)
        except aiohttp.WSServerHandshakeError as exc:
            raise CreateFailed(f"exec into pod {pod.name} refused: {exc.status} {exc.message}") from None
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            raise BackendUnavailable(f"exec into pod {pod.name} failed: {type(exc).__name__}: {exc}") from None

    async def open_shell(self, pod: PodRef, command: list[str]) -> ExecStream:
        assert self._background is not None, "transport not started"
        return ExecStream(await self._connect(pod, command, stdin=True), self._background)

    async def open_output(self, pod: PodRef, command: list[str]) -> OutputStream:
        return OutputStream(await self._connect(pod, command, stdin=False))

    async def open_stream(self, pod: PodRef, command: list[str]) -> DuplexStream:
        """stdin and stdout of one exec websocket, read on demand. The exec protocol here
        (v4) has no way to close stdin alone: ``send_eof`` is not supported."""
        return DuplexStream(await self._connect(pod, command, stdin=True))

    async def run(
        self, pod: PodRef, command: list[str], timeout: float, *, container: str = CONTAINER
    ) -> tuple[int | None, bytes, bytes]:
        """A fresh exec websocket for one command (in the sandbox container unless ``container``
        names another of the pod's): (exit code or None, stdout, stderr)."""
        out, err, status = bytearray(), bytearray(), ""
        with anyio.fail_after(timeout):
            connection = await self._connect(pod, command, stdin=False, container=container)
            try:
                while (message := await connection.read()) is not None:
                    channel, data = message
                    if channel == 1:
                        out += data
                    elif channel == 2:
                        err += data
                    elif channel == 3:
                        status = data.decode(errors="replace")
            finally:
                await connection.close()
        return exit_code(status), bytes(out), bytes(err)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._connector_session is not None:
            await self._connector_session.close()  # owns the connector
            self._connector_session = None


def exit_code(status: str) -> int | None:
    """The exit code in an exec's final Status (channel 3); None when there is none."""
    if not status:
        return None
    try:
        parsed = json.loads(status)
    except ValueError:
        return None
    if parsed.get("status") == "Success":
        return 0
    for cause in (parsed.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            with contextlib.suppress(ValueError):
                return int(cause.get("message"))
    return None

"""Commands over the pod IP: ``PodIpTransport`` reaches the relay in each pod (``relay``) with
a direct TCP connection, so a sandbox's shell, its output relays, its streams and its
interrupts keep working while the API server is down (a restart, an upgrade). The exec
websocket (``ExecTransport``) is the fallback, chosen per pod when its shell is opened:

* the pod has no IP yet, or was made without a secret (``attach`` by another controller);
* the pod IP does not answer (no route, or connect timeouts on three pods in a row: the
  controller is outside the pod network). That turns the relay off for the rest of the
  adapter's life: a few slow connects, not one per create;
* nothing listens (the image has no ``python3``): retried for ``RELAY_WAIT`` seconds (the
  relay may still be starting), then that image goes to the websocket from then on, in
  every adapter of this process (``IMAGES_WITHOUT_RELAY``);
* the relay refuses the secret (something else listens on the port).

Once a pod's shell went one way, every other connection to that pod goes the same way.
``stats`` counts connections by route (``relay``, ``exec``) and the fallbacks by reason.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
from collections import Counter

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from kubernetes_asyncio import client as k8s

from orchard_async.adapters.kubernetes.relay import EXIT, OK, REFUSED, RELAY_PORT, STDERR, STDOUT
from orchard_async.adapters.kubernetes.transport import ExecTransport, PodRef
from orchard_async.errors import BackendUnavailable, CreateFailed
from orchard_async.kit.background import Background
from orchard_async.kit.exec_streams import DuplexStream, ExecStream, OutputStream

CONNECT_TIMEOUT = 2.0  # a pod IP that does not answer within this is not routable from here
RELAY_WAIT = 5.0  # how long a refused connection may mean "the relay is still starting" (python3 on a busy node)
TIMEOUTS_TO_GIVE_UP = 3  # connect timeouts in a row before pod IPs count as unroutable (one may be load)
UNROUTABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT}
MAX_FRAME = 16 * 1024 * 1024
# images whose pods had no relay: what an image holds does not change with the adapter, and
# each adapter finding out again would cost every create of it RELAY_WAIT
IMAGES_WITHOUT_RELAY: set[str] = set()


def _errno(exc: BaseException) -> int | None:
    """The errno behind a failed connect: anyio wraps the attempts' errors in one without it."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno
        if isinstance(seen, BaseExceptionGroup) and seen.exceptions:
            seen = seen.exceptions[-1]
        else:
            seen = seen.__cause__
    return None


class RelayRefused(Exception):
    """The relay answered but would not run the command (a wrong secret, a bad argv)."""


class RelayConnection:
    """One relay connection as the container shell's ExecConnection (``relay``'s frames)."""

    def __init__(self, stream: anyio.abc.SocketStream):
        self._stream = stream
        self._frames = BufferedByteReceiveStream(stream)

    async def read(self) -> tuple[int, bytes] | None:
        try:
            channel, length = struct.unpack(">BI", await self._frames.receive_exactly(5))
            if length > MAX_FRAME:
                raise anyio.BrokenResourceError(f"relay frame of {length} bytes")
            return channel, await self._frames.receive_exactly(length) if length else b""
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
            return None

    async def write(self, data: bytes) -> None:
        await self._stream.send(data)

    def write_eof(self) -> None:
        # anyio's send_eof is async; the protocol's is not. Sends complete before they return,
        # so nothing is queued behind the FIN.
        self._stream.extra(anyio.abc.SocketAttribute.raw_socket).shutdown(socket.SHUT_WR)

    async def close(self) -> None:
        await self._stream.aclose()


async def connect_relay(ip: str, port: int, secret: str, command: list[str], *, stdin: bool) -> RelayConnection:
    """A relay connection running ``command``; raises OSError/TimeoutError when the pod IP does
    not answer, RelayRefused when the relay will not run it."""
    with anyio.fail_after(CONNECT_TIMEOUT):
        stream = await anyio.connect_tcp(ip, port)
    connection = RelayConnection(stream)
    try:
        raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # a vanished node breaks the stream
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one command, one small write
        header = json.dumps({"argv": command, "stdin": stdin}).encode()
        with anyio.fail_after(CONNECT_TIMEOUT * 5):
            await stream.send(secret.encode() + b"\n" + header + b"\n")
            answer = await connection.read()
        if answer is None:
            raise RelayRefused("the relay closed the connection")
        if answer[0] != OK:
            raise RelayRefused(answer[1].decode(errors="replace"))
    except BaseException:
        with anyio.CancelScope(shield=True):
            await connection.close()
        raise
    return connection


class PodIpTransport:
    """The relay over the pod IP, the exec websocket (``fallback``) where it cannot be used."""

    name = "pod-ip"

    def __init__(self, fallback: ExecTransport | None = None, *, relay_port: int = RELAY_PORT):
        self.fallback = fallback or ExecTransport()
        self.relay_port = relay_port  # the adapter puts a relay in its pods when this is set
        self.stats: Counter[str] = Counter()
        self.unroutable = ""  # why pod IPs are not used any more (empty: they are)
        self._timeouts = 0  # connect timeouts in a row
        self._routes: dict[str, tuple[str, str]] = {}  # pod name -> (ip, secret): its shell went over the relay
        self._background: Background | None = None

    async def start(self, configuration: k8s.Configuration, background: Background) -> None:
        self._background = background
        await self.fallback.start(configuration, background)

    def forget(self, pod: PodRef) -> None:
        self._routes.pop(pod.name, None)

    async def _shell_connection(self, pod: PodRef, command: list[str]) -> RelayConnection | None:
        """The shell's relay connection, or None (and why, counted) when it is the websocket's."""
        if not (pod.ip and pod.secret) or self.unroutable or pod.image in IMAGES_WITHOUT_RELAY:
            self.stats["fallback_not_tried"] += 1
            return None
        waited = 0.0
        while True:
            try:
                connection = await connect_relay(pod.ip, self.relay_port, pod.secret, command, stdin=True)
                self._timeouts = 0
                return connection
            except RelayRefused:
                self.stats["fallback_refused"] += 1
                return None
            except TimeoutError:
                self._timeouts += 1
                if self._timeouts >= TIMEOUTS_TO_GIVE_UP:
                    self.unroutable = f"connecting to pod IPs timed out {self._timeouts} times in a row"
            except OSError as exc:
                code = _errno(exc)
                if code == errno.ECONNREFUSED and waited < RELAY_WAIT:
                    await anyio.sleep(0.05)
                    waited += 0.05
                    continue
                if code == errno.ECONNREFUSED:
                    IMAGES_WITHOUT_RELAY.add(pod.image)
                    self.stats["fallback_no_relay"] += 1
                    return None
                if code not in UNROUTABLE:
                    self.stats["fallback_error"] += 1
                    return None
                self.unroutable = f"pod IP {pod.ip}: {os.strerror(code)}"
            self.stats["fallback_unroutable"] += 1
            return None

    async def _connect(self, pod: PodRef, command: list[str], stdin: bool) -> RelayConnection | None:
        """A relay connection when this pod's shell went over the relay, else None."""
        route = self._routes.get(pod.name)
        if route is None:
            return None
        ip, secret = route
        try:
            connection = await connect_relay(ip, self.relay_port, secret, command, stdin=stdin)
        except (OSError, TimeoutError, RelayRefused) as exc:
            raise BackendUnavailable(f"relay in pod {pod.name} failed: {type(exc).__name__}: {exc}") from None
        self.stats["relay"] += 1
        return connection

    async def open_shell(self, pod: PodRef, command: list[str]) -> ExecStream:
        assert self._background is not None, "transport not started"
        connection = await self._shell_connection(pod, command)
        if connection is None:
            self.stats["exec"] += 1
            return await self.fallback.open_shell(pod, command)
        assert pod.ip and pod.secret
        self._routes[pod.name] = (pod.ip, pod.secret)
        self.stats["relay"] += 1
        return ExecStream(connection, self._background)

    async def open_output(self, pod: PodRef, command: list[str]) -> OutputStream:
        connection = await self._connect(pod, command, stdin=False)
        if connection is None:
            self.stats["exec"] += 1
            return await self.fallback.open_output(pod, command)
        return OutputStream(connection)

    async def open_stream(self, pod: PodRef, command: list[str]) -> DuplexStream:
        connection = await self._connect(pod, command, stdin=True)
        if connection is None:
            self.stats["exec"] += 1
            return await self.fallback.open_stream(pod, command)
        return DuplexStream(connection)

    async def run(self, pod: PodRef, command: list[str], timeout: float) -> tuple[int | None, bytes, bytes]:
        if pod.name not in self._routes:
            self.stats["exec"] += 1
            return await self.fallback.run(pod, command, timeout)
        out, err, code = bytearray(), bytearray(), None
        with anyio.fail_after(timeout):
            connection = await self._connect(pod, command, stdin=False)
            assert connection is not None
            try:
                while (message := await connection.read()) is not None:
                    channel, data = message
                    if channel == STDOUT:
                        out += data
                    elif channel == STDERR:
                        err += data
                    elif channel == EXIT:
                        code = int(data)
                    elif channel == REFUSED:
                        raise CreateFailed(f"relay in pod {pod.name}: {data.decode(errors='replace')}")
            finally:
                await connection.close()
        return code, bytes(out), bytes(err)

    async def close(self) -> None:
        self._routes.clear()
        await self.fallback.close()

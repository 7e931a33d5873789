"""HTTP/1.1 to one port inside a sandbox over pooled ``connect`` streams (h11, sans-I/O): the
sandbox side of the services proxy's HTTP (services.py).

Not httpx over ``SandboxTransport``: its connection pool queues callers, which at 16 of them
cost several times the latency and a fifth of the throughput of a plain relay (bench service
--exposed). Here a request takes an idle connection or opens one (a relay process in the
sandbox), and gives it back when both sides are done with the exchange; the server's
keep-alive decides, as h11 reads it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import anyio
import anyio.abc
import h11

import orchard_async as oa

MAX_IDLE = 32  # connections kept open per exposure for the next requests
READ_SIZE = 65536
GONE = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    ConnectionError,
    h11.RemoteProtocolError,
)


class Exchange:
    """One response, its body read with ``body()``; ``close`` hands the connection back."""

    def __init__(self, pool: UpstreamPool, stream: anyio.abc.ByteStream, conn: h11.Connection, head: h11.Response):
        self.status = head.status_code
        self.reason = head.reason.decode("latin-1")
        self.headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in head.headers]
        self._pool, self._stream, self._conn = pool, stream, conn
        self._done = False

    async def body(self) -> AsyncIterator[bytes]:
        while True:
            event = await _next_event(self._conn, self._stream)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._done = True
                return
            elif isinstance(event, h11.ConnectionClosed):
                return

    async def close(self) -> None:
        conn, stream = self._conn, self._stream
        if self._done and conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
            await self._pool.give_back(stream, conn)
        else:
            with anyio.CancelScope(shield=True):
                await stream.aclose()


async def _next_event(conn: h11.Connection, stream: anyio.abc.ByteStream) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive(READ_SIZE)
        except anyio.EndOfStream:
            data = b""
        conn.receive_data(data)


class UpstreamPool:
    def __init__(self, sandbox: oa.Sandbox, port: int):
        self.sandbox = sandbox
        self.port = port
        self._idle: list[tuple[anyio.abc.ByteStream, h11.Connection]] = []
        self._closed = False

    async def give_back(self, stream: anyio.abc.ByteStream, conn: h11.Connection) -> None:
        if self._closed or len(self._idle) >= MAX_IDLE:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
        else:
            self._idle.append((stream, conn))

    async def request(self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes) -> Exchange:
        """The response's head (its body to read from the exchange). ``ConnectionRefusedError``
        when nothing listens on the port; a reused connection the server had closed is
        retried once on a new one (nothing of the request can have been read then)."""
        head = [("Host", f"127.0.0.1:{self.port}"), *headers, ("Content-Length", str(len(body)))]
        request = h11.Request(method=method, target=target, headers=head)
        while True:
            reused = bool(self._idle)
            stream, conn = (
                self._idle.pop() if reused else (await self.sandbox.connect(self.port), h11.Connection(h11.CLIENT))
            )
            try:
                data = conn.send(request) + (conn.send(h11.Data(data=body)) if body else b"")
                await stream.send(data + conn.send(h11.EndOfMessage()))
                while True:
                    event = await _next_event(conn, stream)
                    if isinstance(event, h11.Response):
                        return Exchange(self, stream, conn, event)
                    if isinstance(event, h11.ConnectionClosed):
                        raise anyio.EndOfStream
                    # an InformationalResponse (100 Continue): the final one follows
            except GONE:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
                if not reused:
                    raise ConnectionResetError(f"the server on port {self.port} closed the connection") from None
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
                raise

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        with anyio.CancelScope(shield=True):
            for stream, _ in idle:
                await stream.aclose()

"""A WebSocket client over one ``connect`` into a sandbox (wsproto, sans-I/O): the sandbox
side of the services proxy (services.py), which aiohttp's client cannot be (it dials TCP)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import anyio
import anyio.abc
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

import orchard_async as oa

HANDSHAKE_TIMEOUT = 30.0


class UpstreamWebSocket:
    def __init__(self, stream: anyio.abc.ByteStream):
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.subprotocol: str | None = None
        self.rejected: int | None = None  # the server's HTTP status when it refused the upgrade
        self.close_code: int | None = None
        self.close_reason = ""
        self._pending: list[Event] = []
        self._lock = anyio.Lock()

    @classmethod
    async def open(
        cls, sandbox: oa.Sandbox, port: int, target: str, headers: Sequence[tuple[str, str]], protocols: list[str]
    ) -> UpstreamWebSocket:
        """Connect and shake hands; ``rejected`` set when the server answered without upgrading."""
        self = cls(await sandbox.connect(port))
        try:
            extra = [(name.encode(), value.encode()) for name, value in headers]
            await self.stream.send(
                self.ws.send(
                    Request(host=f"127.0.0.1:{port}", target=target, subprotocols=protocols, extra_headers=extra)
                )
            )
            with anyio.fail_after(HANDSHAKE_TIMEOUT):
                while True:
                    self.ws.receive_data(await self.stream.receive())
                    for event in self.ws.events():
                        if isinstance(event, AcceptConnection):
                            self.subprotocol = event.subprotocol
                            return self
                        if isinstance(event, RejectConnection):
                            self.rejected = event.status_code
                            return self
                        self._pending.append(event)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.stream.aclose()
            raise

    async def send(self, data: str | bytes) -> None:
        async with self._lock:
            if self.ws.state is ConnectionState.OPEN:
                await self.stream.send(self.ws.send(TextMessage(data) if isinstance(data, str) else BytesMessage(data)))

    async def send_close(self, code: int) -> None:
        async with self._lock:
            if self.ws.state is ConnectionState.OPEN:
                # 1005/1006 are never sent on the wire: a peer that vanished is a plain close
                code = 1000 if code in (1005, 1006) or not 1000 <= code < 5000 else code
                await self.stream.send(self.ws.send(CloseConnection(code=code)))

    async def messages(self) -> AsyncIterator[str | bytes]:
        """Whole messages until the server closes (``close_code``) or the stream ends."""
        text: list[str] = []
        binary: list[bytes] = []
        while True:
            for event in self._pending:
                if isinstance(event, TextMessage):
                    text.append(event.data)
                    if event.message_finished:
                        yield "".join(text)
                        text = []
                elif isinstance(event, BytesMessage):
                    binary.append(bytes(event.data))
                    if event.message_finished:
                        yield b"".join(binary)
                        binary = []
                elif isinstance(event, Ping):
                    async with self._lock:
                        await self.stream.send(self.ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    self.close_code, self.close_reason = event.code, event.reason or ""
                    async with self._lock:
                        if self.ws.state is not ConnectionState.CLOSED:
                            await self.stream.send(self.ws.send(event.response()))
                    return
                elif isinstance(event, RejectData):
                    pass
            self._pending = []
            try:
                data = await self.stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return
            self.ws.receive_data(data)
            self._pending = list(self.ws.events())

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.stream.aclose()

"""A loopback TCP proxy that loses one answer: what a client sees when the service is killed
after its request landed (the request reaches the service, the answer never comes back)."""

from __future__ import annotations

import asyncio
import contextlib


class CuttingProxy:
    """Forwards 127.0.0.1:``port`` to ``target_port``. ``cut(prefix)`` arms it: the next request
    whose first bytes are ``prefix`` goes through, its answer is dropped and the connection
    closed; from then on (until ``resume``) new connections are closed at once, as a dead
    service's would be, while the test kills and restarts the service."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = 0
        self.cut_done = asyncio.Event()
        self._prefix: bytes | None = None
        self._holding = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self, prefix: bytes) -> None:
        self._prefix = prefix
        self.cut_done.clear()

    def resume(self) -> None:
        self._holding = False

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        if self._holding:
            client_out.close()
            return
        try:
            server_in, server_out = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_out.close()
            return
        cutting = asyncio.Event()
        upstream = asyncio.ensure_future(self._pump_requests(client_in, server_out, cutting))
        downstream = asyncio.ensure_future(self._pump_answers(server_in, client_out, cutting))
        self._tasks |= {upstream, downstream}
        await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
        for task in (upstream, downstream):
            task.cancel()
            self._tasks.discard(task)
        for writer in (client_out, server_out):
            writer.close()

    async def _pump_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cutting: asyncio.Event
    ) -> None:
        while chunk := await reader.read(65536):
            if self._prefix is not None and chunk.startswith(self._prefix):
                self._prefix = None
                cutting.set()
            writer.write(chunk)
            await writer.drain()

    async def _pump_answers(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cutting: asyncio.Event
    ) -> None:
        while chunk := await reader.read(65536):
            if cutting.is_set():  # the answer to the cut request: lost, and the service "dies"
                self._holding = True
                self.cut_done.set()
                with contextlib.suppress(OSError):
                    writer.transport.abort()
                return
            writer.write(chunk)
            await writer.drain()

"""Byte streams over one exec of a container (docker's attach stream, a Kubernetes exec
websocket, the pod-IP relay): what the container shell (orchard_async.kit.container_shell) speaks
its protocol over.

* ``ExecConnection``: the backend's side, messages tagged with their stream;
* ``ExecStream``: the shell exec's stdin/stdout, drained by a reader task;
* ``OutputStream``: an output relay's stdout, read on demand; ``DuplexStream``: stdin and
  stdout on demand (``Sandbox.open_stream``);
* ``SplitRelay``: both output relays over one connection (the relays in a container's main
  process);
* ``Heartbeat``: the keepalive's sender over idle shell streams.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from typing import Protocol

import anyio
import anyio.abc

from orchard_async.kit.background import Background

STDERR_KEPT = 4096  # bytes of an exec's own stderr kept to explain a shell that did not start
SEND_TIMEOUT = 30.0  # writing one frame into an exec, plus time for its size
SEND_RATE = 1e6  # bytes per second assumed for big frames (file writes)
CLOSE_TIMEOUT = 2.0  # a close handshake the caller waits for, at most
RELAYS_FAILED = "@@ORCHARD-RELAYS-FAILED"  # what the relays in a main process say when they cannot start


class ExecConnection(Protocol):
    """One exec's connection as a backend gives it: messages tagged with their stream."""

    async def read(self) -> tuple[int, bytes] | None:
        """The next message: (1 stdout | 2 stderr | 3 final status, data); None at the end."""
        ...

    async def write(self, data: bytes) -> None:
        """Into the process's stdin; raises when the connection is gone."""
        ...

    def write_eof(self) -> None:
        """Close the process's stdin alone (raises where the backend cannot)."""
        ...

    async def close(self) -> None: ...


class _Tails:
    """What an exec says besides stdout: its stderr's tail (to explain a shell or relay that
    did not start) and its final status."""

    stderr_tail = b""
    status = ""

    def _aside(self, channel: int, data: bytes) -> None:
        if channel == 2:
            self.stderr_tail = (self.stderr_tail + data)[-STDERR_KEPT:]
        elif channel == 3:
            self.status = data.decode(errors="replace")


async def _write(connection: ExecConnection, item: bytes) -> None:
    """A write under a timeout that grows with its size; a stalled or broken connection is
    the end of the stream (the backends' clients fail with many error types then)."""
    try:
        with anyio.fail_after(SEND_TIMEOUT + len(item) / SEND_RATE):
            await connection.write(item)
    except anyio.BrokenResourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - TimeoutError, or any failure of the connection
        raise anyio.BrokenResourceError(f"the exec stream is gone ({type(exc).__name__})") from exc


async def _close(connection: ExecConnection) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT), contextlib.suppress(Exception):
        await connection.close()


class ExecStream(_Tails, anyio.abc.ByteStream):
    """The shell exec's stdin/stdout as an anyio ByteStream, for ShellClient.

    A reader task (in the adapter's ``background``) drains the connection into an unbounded
    buffer as soon as bytes arrive: a client busy writing a large frame while the shell
    writes output would otherwise deadlock against the backend's flow control. The buffer
    stays small because the client reads every frame to its end.
    """

    def __init__(self, connection: ExecConnection, background: Background):
        self._connection = connection
        self._send, self._receive = anyio.create_memory_object_stream[bytes](max_buffer_size=math.inf)
        self._pending = b""
        self.last_sent = time.monotonic()  # for the keepalive: idle streams get a heartbeat
        self._drained = anyio.Event()
        self._reader = background.start_soon(self._pump)

    async def _pump(self) -> None:
        try:
            while (message := await self._connection.read()) is not None:
                channel, data = message
                if channel == 1:
                    self._send.send_nowait(data)
                else:
                    self._aside(channel, data)
        except Exception:  # noqa: BLE001 - any failure of the connection is the end of the stream
            pass
        finally:
            self._send.close()  # the client's next receive sees EndOfStream
            self._drained.set()

    async def ended(self) -> None:
        """Until the exec's output has ended (its shell exited, or the connection broke)."""
        await self._drained.wait()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._pending:
            self._pending = await self._receive.receive()
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def send(self, item: bytes) -> None:
        self.last_sent = time.monotonic()
        await _write(self._connection, item)

    async def beat(self, limit: float) -> None:
        """The keepalive's heartbeat: a newline, which the shell reads as an empty command.
        It never lands inside a frame: each frame is one write, and so is this. Waiting for
        the drain is bounded: one slow stream must not hold back the others' heartbeats."""
        self.last_sent = time.monotonic()
        with anyio.move_on_after(limit), contextlib.suppress(Exception):
            await self._connection.write(b"\n")

    async def send_eof(self) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._reader.cancel()
        await _close(self._connection)
        self._receive.close()


class OutputStream(_Tails, anyio.abc.ByteReceiveStream):
    """The stdout of one exec, read on demand (an output relay, see RELAY): unread, it
    applies backpressure all the way to the process writing. Any failure of the connection
    is the end of the stream."""

    def __init__(self, connection: ExecConnection):
        self._connection = connection
        self._pending = b""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._pending:
            try:
                message = await self._connection.read()
            except Exception as exc:  # noqa: BLE001 - a broken connection ends the stream
                raise anyio.BrokenResourceError(f"the exec stream is gone ({type(exc).__name__})") from exc
            if message is None:
                raise anyio.EndOfStream
            channel, data = message
            if channel == 1:
                self._pending = data
            else:
                self._aside(channel, data)
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def ready(self, name: str) -> None:
        """Wait for the relay's ready line; what follows it stays for the shell client."""
        line = f"@@RELAY {name}\n".encode()
        received = b""
        while not received.startswith(line):
            if len(received) >= len(line):
                raise anyio.BrokenResourceError(f"the output relay said {received[:80]!r}")
            received += await self.receive()
        self._pending = received[len(line) :] + self._pending

    async def aclose(self) -> None:
        await _close(self._connection)


class DuplexStream(OutputStream, anyio.abc.ByteStream):
    """stdin and stdout of one exec (``Sandbox.open_stream``), both on demand: unread output
    holds the process back, as a pipe would."""

    async def send(self, item: bytes) -> None:
        await _write(self._connection, item)

    async def send_eof(self) -> None:
        self._connection.write_eof()


class RelaysFailed(anyio.BrokenResourceError):
    """The relays in the main process could not make their FIFOs (RELAYS_IN_MAIN said why)."""


class SplitRelay:
    """Both output relays over one connection (``RELAYS_IN_MAIN``): stdout carries FIFO "o",
    stderr FIFO "e". Each side is read on demand; what arrives for the other side meanwhile
    waits here, in memory: at most the end of one command's output, since both sides are read
    while a command runs and neither between commands (backpressure holds then)."""

    def __init__(self, connection: ExecConnection):
        self._connection = connection
        self._lock = anyio.Lock()  # one reader of the connection at a time
        self._pending: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self._ended = False
        self.sides = (_RelaySide(self, 1), _RelaySide(self, 2))

    async def receive(self, channel: int, max_bytes: int) -> bytes:
        pending = self._pending[channel]
        while not pending:
            if self._ended:
                raise anyio.EndOfStream
            async with self._lock:
                if pending or self._ended:
                    continue
                try:
                    message = await self._connection.read()
                except Exception as exc:  # noqa: BLE001 - a broken connection ends both sides
                    self._ended = True
                    raise anyio.BrokenResourceError(f"the relay stream is gone ({type(exc).__name__})") from exc
                if message is None:
                    self._ended = True
                elif message[0] in self._pending:
                    self._pending[message[0]] += message[1]
        chunk = bytes(pending[:max_bytes])
        del pending[:max_bytes]
        return chunk

    async def ready(self) -> None:
        """Wait for both ready lines. RelaysFailed with why the FIFOs could not be made;
        BrokenResourceError or EndOfStream when the stream itself failed."""
        out, err = self.sides
        line, failed = b"@@RELAY o\n", RELAYS_FAILED.encode()
        received = b""
        while not received.startswith(line):
            if failed in received:
                raise RelaysFailed(received.split(failed)[0].decode(errors="replace").strip() or "no reason given")
            if len(received) > STDERR_KEPT:
                raise anyio.BrokenResourceError(f"the output relay said {received[:80]!r}")
            received += await out.receive()
        out._pending = received[len(line) :]
        await err.ready("e")

    async def close(self) -> None:
        await _close(self._connection)


class _RelaySide(OutputStream):
    """One side of a SplitRelay, as an OutputStream."""

    def __init__(self, split: SplitRelay, channel: int):
        self._split = split
        self._channel = channel
        self._pending = b""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._pending:
            return await self._split.receive(self._channel, max_bytes)
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def aclose(self) -> None:
        await self._split.close()


async def close_streams(streams: Sequence[anyio.abc.AsyncResource]) -> None:
    with anyio.CancelScope(shield=True):
        for stream in streams:
            await stream.aclose()


class Heartbeat:
    """The keepalive's sender (see SHELL_WRAPPER): one task per adapter (in its
    ``background``) that, every second, beats on each shell stream that sent nothing for a
    second (a busy stream needs none). It runs while there are streams and is started again
    by the next ``add``; the adapter's ``close`` ends it with the rest of its background."""

    def __init__(self, keepalive: float, background: Background):
        self.interval = min(1.0, keepalive / 6)
        self.streams: dict[str, ExecStream] = {}
        self._background = background
        self._beating = False

    def add(self, name: str, stream: ExecStream) -> None:
        self.streams[name] = stream
        if not self._beating:
            self._beating = True
            self._background.start_soon(self._beat_idle_streams)

    def discard(self, name: str) -> None:
        self.streams.pop(name, None)

    async def _beat_idle_streams(self) -> None:
        try:
            while self.streams:
                await anyio.sleep(self.interval)
                due = time.monotonic() - self.interval
                idle = [stream for stream in self.streams.values() if stream.last_sent <= due]
                async with anyio.create_task_group() as group:  # beat() never raises
                    for stream in idle:
                        group.start_soon(stream.beat, self.interval)
        finally:
            self._beating = False

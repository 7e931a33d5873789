"""Byte streams into a sandbox: to a process inside it, and to a port on its loopback.

The controller reaches a program inside a sandbox without a command per message and
without giving the sandbox any network:

* ``Sandbox.open_stream(argv)`` starts ``argv`` in the sandbox (its namespaces, its limits,
  its working directory) and returns a ``SandboxStream``, an anyio ``ByteStream`` over the
  process's stdin and stdout. Each adapter carries the bytes its own way (local: two FIFOs;
  docker: one exec attach; kubernetes: one exec websocket); the rest is here.
* ``connect(sandbox, port)`` is a TCP connection to ``127.0.0.1:PORT`` inside the sandbox: a
  stream to a small relay process in the sandbox (``CONNECT_RELAY``: the image's ``python3``,
  else busybox ``nc``) that connects there and copies bytes both ways.
* ``SandboxTransport(sandbox, port)`` makes that an httpx transport, and
  ``forward(sandbox, port)`` a listener on the controller's loopback relaying each
  connection it accepts through a new ``connect``: for libraries that want a URL.

The process behind a stream is started by a wrapper (``STREAM_WRAPPER``) that first prints
its pid (or why it cannot start) on a line of its own; closing the stream kills that pid
and everything it started, through the sandbox's shell.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.abc import SocketAttribute

from orchard_async.errors import ConfigError, SandboxLost

if TYPE_CHECKING:
    from orchard_async.protocols import Sandbox

START_TIMEOUT = 30.0  # from asking for a stream to its process running
KILL_TIMEOUT = 10.0  # the cleanup command when a stream closes (it waits for the shell)
LINE_LIMIT = 4096  # the wrapper's and the relay's first lines are short
log = logging.getLogger("orchard_async.kit.streams")

# `$1` the directory to start in, then the program and its arguments. The first line out is
# the process's pid, or `@@ERR <why>` when it cannot start; then the program's own output.
# `command -v` catches a missing program before anything is promised.
STREAM_WRAPPER = (
    'cd -- "$1" 2>/dev/null || { echo "@@ERR cannot enter directory $1"; exit 126; }; shift; '
    'command -v "$1" >/dev/null 2>&1 || { echo "@@ERR $1: command not found"; exit 127; }; '
    'echo "$$"; exec "$@"'
)

# Kills a process and all its descendants, each frozen first so it cannot fork away (the
# same walk as the shell server's own, which this does not rely on), then waits (up to 5 s)
# until the process is dead: a SIGKILL is delivered at once, but a process takes a moment
# to die. A zombie is dead. `{pid}` the process.
KILL_TREE = (
    '_k() { kill -STOP "$1" 2>/dev/null || return 0; read -r _kc 2>/dev/null <"/proc/$1/task/$1/children"; '
    'for _kx in $_kc; do _k "$_kx"; done; kill -KILL "$1" 2>/dev/null; }; _k {pid}; _kw=0; '
    "while [ $_kw -lt 500 ] && read -r _ks 2>/dev/null </proc/{pid}/stat; do "
    'case "$_ks" in *") Z "*|*") X "*) break ;; esac; sleep 0.01; _kw=$((_kw + 1)); done'
)

# The relay behind `connect`, in python3 (any version since 3.3): it connects, says `OK` or
# `ERR <why>` on its first line, then copies stdin to the socket (shutting the socket's write
# side at EOF) and the socket to stdout, and exits when the server closes.
PY_RELAY = r"""
import os, socket, sys, threading
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
except OSError as e:
    os.write(1, ("ERR %s\n" % (e.strerror or e)).encode()); sys.exit(1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
os.write(1, b"OK\n")
def up():
    try:
        while True:
            d = os.read(0, 262144)
            if not d:
                break
            s.sendall(d)
        s.shutdown(socket.SHUT_WR)
    except OSError:
        os._exit(0)
threading.Thread(target=up, daemon=True).start()
try:
    while True:
        d = memoryview(s.recv(262144))
        if not d:
            break
        while d:
            d = d[os.write(1, d):]
except OSError:
    pass
"""

# `$1` the port, `$2` PY_RELAY. Without python3, busybox nc: `-e` runs a shell on the
# connected socket (its stdin and stdout), which says OK and copies between the socket and
# the stream (saved as fds 3 and 4): `cat` one way, `dd` the other; nc itself fails, and
# says so, only when it cannot connect. Not `cat` from the socket: busybox's copies with
# sendfile, which from a socket into a pipe waits for a full buffer before passing anything.
CONNECT_RELAY = r"""
if command -v python3 >/dev/null 2>&1; then exec python3 -I -S -c "$2" "$1"; fi
if ! command -v nc >/dev/null 2>&1; then echo "ERR the sandbox has neither python3 nor nc"; exit 127; fi
exec 3<&0 4>&1
nc 127.0.0.1 "$1" -e sh -c 'echo OK >&4; cat <&3 4>&- & dd bs=65536 >&4 3<&- 2>/dev/null; exit 0' 2>/dev/null ||
  echo "ERR Connection refused"
"""
NO_RELAY_TOOL = "neither python3 nor nc"

StreamOpener = Callable[[Any, list[str]], Awaitable[anyio.abc.ByteStream]]


class SandboxStream(anyio.abc.ByteStream):
    """stdin and stdout of one process inside a sandbox (``pid``, as the sandbox sees it).

    ``send_eof`` closes the process's stdin where the transport can half-close (local and
    docker; the kubernetes exec protocol cannot, and raises ``NotImplementedError``).
    ``aclose`` closes the stream and kills the process and all it started; that goes through
    the sandbox's shell, so it waits for a command that is running there (at most
    ``KILL_TIMEOUT`` seconds; past that the process lives until the sandbox ends)."""

    def __init__(self, transport: anyio.abc.ByteStream, sandbox: Sandbox):
        self.transport = transport
        self.sandbox = sandbox
        self.pid = 0
        self._buffer = b""  # received past a line the stream read for itself
        self._closed = False

    async def read_line(self) -> bytes:
        """One line (without its newline), read before handing the stream out."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > LINE_LIMIT:
                raise anyio.BrokenResourceError(f"expected a short line, got {self._buffer[:80]!r}")
            self._buffer += await self.transport.receive()
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._buffer:
            chunk, self._buffer = self._buffer[:max_bytes], self._buffer[max_bytes:]
            return chunk
        return await self.transport.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self.transport.send(item)

    async def send_eof(self) -> None:
        await self.transport.send_eof()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self.transport.aclose()
            if self.pid and not getattr(self.sandbox, "closed", False):
                with anyio.move_on_after(KILL_TIMEOUT):
                    await self.sandbox.exec(KILL_TREE.replace("{pid}", str(self.pid)), timeout=KILL_TIMEOUT)


def wrapped_argv(argv: Sequence[str], workdir: str) -> list[str]:
    """The command an adapter starts for ``open_stream(argv)``."""
    if isinstance(argv, str) or not argv or not all(isinstance(arg, str) for arg in argv):
        raise ConfigError(f"open_stream needs a non-empty list of strings (argv), got {argv!r}")
    if any("\0" in arg for arg in argv):
        raise ConfigError("open_stream arguments cannot contain NUL bytes")
    return ["sh", "-c", STREAM_WRAPPER, "orchard-stream", workdir, *argv]


async def start_stream(sandbox: Sandbox, opener: StreamOpener, argv: Sequence[str]) -> SandboxStream:
    """Start ``argv`` in ``sandbox`` through an adapter's ``opener`` (which starts the
    command it is given with its stdin and stdout attached and returns them as a byte
    stream) and wait until the process runs."""
    command = wrapped_argv(argv, sandbox.workdir)
    stream = SandboxStream(await opener(sandbox, command), sandbox)
    try:
        with anyio.fail_after(START_TIMEOUT):
            line = await stream.read_line()
    except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
        await stream.aclose()
        raise SandboxLost(f"the process for {argv[0]!r} in sandbox {sandbox.id} did not start ({exc!r})") from None
    if line.startswith(b"@@ERR "):
        await stream.aclose()
        why = line[6:].decode(errors="replace")
        if why.endswith("command not found"):
            raise FileNotFoundError(errno.ENOENT, f"{why} in sandbox {sandbox.id}", argv[0])
        raise OSError(f"{why} in sandbox {sandbox.id}")
    stream.pid = int(line)
    return stream


# -- connections to the sandbox's loopback ----------------------------------------------------


async def connect(sandbox: Sandbox, port: int) -> SandboxStream:
    """A TCP connection to ``127.0.0.1:port`` inside ``sandbox``, as a byte stream.

    Raises ``ConnectionRefusedError`` when nothing listens there (so a caller waiting for a
    server polls this), and ``ConfigError`` when the image has neither python3 nor nc."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError(f"port must be an integer from 1 to 65535, got {port!r}")
    stream = await sandbox.open_stream(["sh", "-c", CONNECT_RELAY, "orchard-connect", str(port), PY_RELAY])
    try:
        with anyio.fail_after(START_TIMEOUT):
            answer = (await stream.read_line()).decode(errors="replace")
    except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
        await stream.aclose()
        raise ConnectionResetError(f"the relay to port {port} in sandbox {sandbox.id} ended ({exc!r})") from None
    if answer == "OK":
        return stream
    await stream.aclose()
    if NO_RELAY_TOOL in answer:
        raise ConfigError(f"connect() needs python3 or nc in the sandbox's image; {sandbox.id} has {NO_RELAY_TOOL}")
    if "refused" in answer.lower():
        raise ConnectionRefusedError(errno.ECONNREFUSED, f"nothing listens on 127.0.0.1:{port} in {sandbox.id}")
    raise ConnectionError(f"connecting to 127.0.0.1:{port} in {sandbox.id} failed: {answer.removeprefix('ERR ')}")


async def _pump(source: anyio.abc.ByteReceiveStream, sink: anyio.abc.ByteSendStream) -> None:
    """Copy until the source ends; then half-close the sink where it can."""
    try:
        async for chunk in source:
            await sink.send(chunk)
        await sink.send_eof()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, NotImplementedError, OSError):
        pass


async def splice(client: anyio.abc.ByteStream, sandbox: Sandbox, port: int) -> None:
    """One forwarded connection: until the sandbox's side ends. Any failure closes this
    connection only (the client sees it closed), never the forward."""
    async with client:
        try:
            remote = await connect(sandbox, port)
        except ConnectionRefusedError:
            return  # nothing listens yet: a client polling for a server sees its connection closed
        except Exception as exc:  # noqa: BLE001 - one connection's failure, whatever it is, is not the forward's
            log.warning("forward to 127.0.0.1:%d in %s: a connection failed: %s", port, sandbox.id, exc)
            return
        async with remote, anyio.create_task_group() as group:
            group.start_soon(_pump, client, remote)
            await _pump(remote, client)
            group.cancel_scope.cancel()


@asynccontextmanager
async def forward(sandbox: Sandbox, port: int, *, host: str = "127.0.0.1") -> AsyncIterator[tuple[str, int]]:
    """Listen on a free port of the controller's ``host`` (loopback by default) and relay
    every connection accepted there to ``127.0.0.1:port`` inside the sandbox, each through a
    new ``connect``; yields ``(host, local_port)``. Any local user can connect to the
    listener while it is open: it is for URLs a library on this machine needs (Playwright's
    ``connect_over_cdp``), not a way to publish a sandbox."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError(f"port must be an integer from 1 to 65535, got {port!r}")
    listener = await anyio.create_tcp_listener(local_host=host, local_port=0)
    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, lambda client: splice(client, sandbox, port))
        yield host, listener.extra(SocketAttribute.local_port)
        group.cancel_scope.cancel()


# -- httpx --------------------------------------------------------------------------------
# httpx and httpcore are imported when a transport is made: importing them costs more than
# the whole core, and only callers that speak HTTP to a sandbox need them.


class _SandboxSocket:
    """httpcore's network stream over one ``connect``."""

    def __init__(self, stream: SandboxStream):
        self.stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        import httpcore

        try:
            with anyio.fail_after(timeout):
                return await self.stream.receive(max_bytes)
        except anyio.EndOfStream:
            return b""
        except TimeoutError:
            raise httpcore.ReadTimeout(f"no data from the sandbox within {timeout}s") from None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        import httpcore

        if not buffer:
            return
        try:
            with anyio.fail_after(timeout):
                await self.stream.send(buffer)
        except TimeoutError:
            raise httpcore.WriteTimeout(f"the sandbox took no data within {timeout}s") from None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:  # httpcore's network-stream verb, not ours (close)
        await self.stream.aclose()

    async def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> Any:
        import httpcore

        raise httpcore.ConnectError("https into a sandbox is not supported: its loopback needs no TLS; use http://")

    def get_extra_info(self, info: str) -> Any:
        return None


class _SandboxNetwork:
    """httpcore's network backend: every TCP connection goes to the sandbox's loopback."""

    def __init__(self, sandbox: Sandbox, port: int | None):
        self.sandbox = sandbox
        self.port = port

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, **_: Any) -> _SandboxSocket:
        import httpcore

        try:
            with anyio.fail_after(timeout):
                return _SandboxSocket(await connect(self.sandbox, self.port or port))
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"connecting into sandbox {self.sandbox.id} took over {timeout}s") from None
        except (OSError, SandboxLost) as exc:
            raise httpcore.ConnectError(str(exc)) from exc

    async def connect_unix_socket(self, path: str, timeout: float | None = None, **_: Any) -> _SandboxSocket:
        import httpcore

        raise httpcore.ConnectError("a sandbox transport connects to TCP ports only")

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class SandboxTransport:
    """An httpx transport to the sandbox's loopback, for ``httpx.AsyncClient(transport=...)``.

    With ``port``, every request goes to ``127.0.0.1:port`` inside the sandbox whatever its
    URL says; without, to the URL's port. The URL's host is not looked at: the sandbox has
    only its loopback. Connections are pooled (keep-alive, ``limits``) as httpx does; each
    is one ``connect``."""

    def __init__(self, sandbox: Sandbox, port: int | None = None, *, limits: Any = None, retries: int = 0):
        import httpcore
        import httpx

        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise ConfigError(f"port must be an integer from 1 to 65535, got {port!r}")
        limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
        self._http = httpx.AsyncHTTPTransport(limits=limits, retries=retries)
        # httpx's transport (request and response conversion, error mapping) over a pool of
        # our own: httpx takes no network backend, httpcore's pool does.
        self._http._pool = httpcore.AsyncConnectionPool(
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            retries=retries,
            network_backend=_SandboxNetwork(sandbox, port),
        )

    async def handle_async_request(self, request: Any) -> Any:
        return await self._http.handle_async_request(request)

    async def aclose(self) -> None:  # httpx's transport verb, not ours (close)
        await self._http.aclose()

    async def __aenter__(self) -> SandboxTransport:
        await self._http.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._http.__aexit__(*exc)


# -- local pipes ------------------------------------------------------------------------------


class PipeStream(anyio.abc.ByteStream):
    """Two non-blocking pipe ends (read, write) as a ByteStream: the local adapter's
    transport to a process it started on FIFOs. ``on_close`` runs once both are closed."""

    def __init__(self, read_fd: int, write_fd: int, on_close: Callable[[], None] = lambda: None):
        self._read_fd = read_fd
        self._write_fd = write_fd
        self._on_close = on_close

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while True:
            if self._read_fd < 0:
                raise anyio.ClosedResourceError
            try:
                data = os.read(self._read_fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._read_fd)
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError(str(exc)) from exc
            if not data:
                raise anyio.EndOfStream
            return data

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        await anyio.lowlevel.checkpoint()
        while view:
            if self._write_fd < 0:
                raise anyio.ClosedResourceError
            try:
                view = view[os.write(self._write_fd, view) :]
            except BlockingIOError:
                await anyio.wait_writable(self._write_fd)
            except OSError as exc:  # BrokenPipeError: the process closed its stdin or ended
                raise anyio.BrokenResourceError(str(exc)) from exc

    @staticmethod
    def _close(fd: int) -> int:
        if fd >= 0:
            anyio.notify_closing(fd)  # a task waiting on it gets ClosedResourceError
            os.close(fd)
        return -1

    async def send_eof(self) -> None:
        self._write_fd = self._close(self._write_fd)

    async def aclose(self) -> None:
        if self._read_fd < 0 and self._write_fd < 0:
            return
        self._read_fd = self._close(self._read_fd)
        self._write_fd = self._close(self._write_fd)
        self._on_close()
        await anyio.lowlevel.checkpoint()

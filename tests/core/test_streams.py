"""orchard_async.kit.streams without an adapter: a stand-in sandbox whose processes run on this
host exercises the wrapper, the cleanup, both relays (python3 and busybox nc), the httpx
transport and the forward. tests/conformance/test_stream.py runs the same on every adapter."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import socketserver
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest
from anyio.streams.stapled import StapledByteStream

import orchard_async as oa
from orchard_async.adapters.sim import SimAdapter
from orchard_async.kit.streams import PipeStream, SandboxStream, start_stream, wrapped_argv


class HostSandbox:
    """Just enough of a sandbox for the streams module: commands and stream processes run on
    this host, with ``path`` as their PATH."""

    def __init__(self, workdir: Path, path: str | None = None):
        self.id = "host"
        self.workdir = str(workdir)
        self.closed = False
        self.env = {"PATH": path or os.environ["PATH"]}
        self.processes: list[anyio.abc.Process] = []

    async def exec(self, cmd: str, *, timeout: float | None = None, **_: object) -> oa.ExecResult:
        done = await anyio.run_process(["sh", "-c", cmd], check=False, env=self.env, cwd=self.workdir)
        reason = oa.ExitReason.OK if done.returncode == 0 else oa.ExitReason.NONZERO
        return oa.ExecResult(exit_code=done.returncode, reason=reason, stdout=done.stdout, stderr=done.stderr)

    async def _open(self, sandbox: HostSandbox, command: list[str]) -> anyio.abc.ByteStream:
        process = await anyio.open_process(command, env=self.env, stderr=subprocess.DEVNULL)
        self.processes.append(process)
        assert process.stdin is not None and process.stdout is not None
        return StapledByteStream(process.stdin, process.stdout)

    async def open_stream(self, argv: list[str]) -> SandboxStream:
        return await start_stream(self, self._open, argv)

    async def connect(self, port: int) -> SandboxStream:
        return await oa.connect(self, port)

    async def aclose(self) -> None:
        for process in self.processes:
            if process.returncode is None:
                process.kill()
            await process.wait()


@pytest.fixture
async def host(tmp_path: Path) -> HostSandbox:
    box = HostSandbox(tmp_path)
    yield box
    await box.aclose()


@pytest.fixture
def busybox_bin(tmp_path: Path) -> str:
    """A PATH with busybox's sh, nc, cat and dd only (no python3): the relay's fallback."""
    busybox = shutil.which("busybox")
    if (
        busybox is None
        or "-e PROG" not in subprocess.run([busybox, "nc", "--help"], capture_output=True, text=True).stderr
    ):
        pytest.skip("needs a busybox whose nc has -e (Debian's busybox-static)")
    bin_dir = tmp_path / "busybox-bin"
    bin_dir.mkdir()
    for applet in ("sh", "nc", "cat", "dd"):
        (bin_dir / applet).symlink_to(busybox)
    return str(bin_dir)


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(262144):
            self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A TCP echo server on this host's loopback (the stand-in sandbox's loopback)."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), EchoHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def http_port(tmp_path: Path) -> Iterator[int]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "hello.txt").write_text("hello\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def running(pid: int) -> bool:
    """Whether a process runs (a zombie, killed but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def program_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def echo_round(stream: anyio.abc.ByteStream, payload: bytes) -> bytes:
    received = bytearray()
    with anyio.fail_after(30):  # a relay that holds data back fails here instead of hanging
        async with anyio.create_task_group() as group:
            group.start_soon(stream.send, payload)
            while len(received) < len(payload):
                received += await stream.receive()
    return bytes(received)


# -- open_stream ----------------------------------------------------------------------------


@pytest.mark.parametrize("argv", ["cat", [], ["cat", "a\0b"], [1]])
def test_argv_must_be_a_list_of_strings(argv: object) -> None:
    with pytest.raises(oa.ConfigError):
        wrapped_argv(argv, "/")  # type: ignore[arg-type]


async def test_a_stream_echoes_and_half_closes(host: HostSandbox) -> None:
    async with await host.open_stream(["cat"]) as stream:
        assert stream.pid == host.processes[0].pid  # the wrapper became the program
        payload = os.urandom(3 * 1024 * 1024)
        assert await echo_round(stream, payload) == payload
        await stream.send_eof()
        with pytest.raises(anyio.EndOfStream):
            await stream.receive()


async def test_closing_a_stream_kills_its_process_and_what_it_started(host: HostSandbox) -> None:
    stream = await host.open_stream(["sh", "-c", "sleep 300 & echo $!; wait"])
    child = int((await stream.read_line()).decode())
    await stream.aclose()
    with anyio.fail_after(10):
        assert await host.processes[0].wait() == -9  # SIGKILL, not the end of its input
    for _ in range(100):  # the orphaned child is reaped by init in its own time
        if not running(child):
            break
        await anyio.sleep(0.05)
    assert not running(child), "closing the stream left its process's child running"


async def test_a_missing_program_or_workdir_fails_to_open(host: HostSandbox, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no-such-program"):
        await host.open_stream(["no-such-program"])
    host.workdir = str(tmp_path / "missing")
    with pytest.raises(OSError, match="cannot enter directory"):
        await host.open_stream(["cat"])


# -- connect ------------------------------------------------------------------------------


async def test_connect_relays_with_python3(host: HostSandbox, echo_port: int) -> None:
    async with await host.connect(echo_port) as connection:
        payload = os.urandom(2 * 1024 * 1024)
        assert await echo_round(connection, payload) == payload


async def test_connect_relays_with_busybox_nc(tmp_path: Path, busybox_bin: str, echo_port: int) -> None:
    box = HostSandbox(tmp_path, path=busybox_bin)
    try:
        async with await box.connect(echo_port) as connection:
            assert "python" not in program_of(connection.pid)
            assert await echo_round(connection, b"small, without a newline") == b"small, without a newline"
            payload = os.urandom(1024 * 1024)
            assert await echo_round(connection, payload) == payload
        with pytest.raises(ConnectionRefusedError):
            await box.connect(free_port())
    finally:
        await box.aclose()


async def test_connect_refuses_a_closed_port_and_a_bad_one(host: HostSandbox) -> None:
    with pytest.raises(ConnectionRefusedError):
        await host.connect(free_port())
    for port in (0, 65536, True, "80"):
        with pytest.raises(oa.ConfigError):
            await host.connect(port)  # type: ignore[arg-type]


async def test_connect_without_python3_or_nc_says_what_the_image_lacks(tmp_path: Path) -> None:
    bin_dir = tmp_path / "sh-only"
    bin_dir.mkdir()
    (bin_dir / "sh").symlink_to(shutil.which("sh") or "/bin/sh")
    box = HostSandbox(tmp_path, path=str(bin_dir))
    try:
        with pytest.raises(oa.ConfigError, match="python3 or nc"):
            await box.connect(80)
    finally:
        await box.aclose()


# -- httpx and forward -------------------------------------------------------------------------


async def test_httpx_through_the_transport(host: HostSandbox, http_port: int) -> None:
    async with httpx.AsyncClient(transport=oa.SandboxTransport(host, http_port)) as client:
        page = await client.get("http://anything/hello.txt")
        assert (page.status_code, page.text) == (200, "hello\n")
        with pytest.raises(httpx.ConnectError, match="not supported"):
            await client.get("https://anything/hello.txt")
    async with httpx.AsyncClient(transport=oa.SandboxTransport(host)) as client:  # the URL's port
        assert (await client.get(f"http://sandbox:{http_port}/hello.txt")).text == "hello\n"
        with pytest.raises(httpx.ConnectError, match="nothing listens"):
            await client.get(f"http://sandbox:{free_port()}/")
    with pytest.raises(oa.ConfigError):
        oa.SandboxTransport(host, 70000)


async def test_a_forward_relays_each_connection_and_survives_a_refused_one(host: HostSandbox) -> None:
    port = free_port()
    async with oa.forward(host, port) as (address, local_port):
        assert address == "127.0.0.1"
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):  # nothing listens inside yet
            async with await anyio.connect_tcp(address, local_port) as refused:
                await refused.receive()

        async def echo(client: anyio.abc.SocketStream) -> None:
            async with client:
                async for chunk in client:
                    await client.send(chunk)

        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
        async with listener, anyio.create_task_group() as group:
            group.start_soon(listener.serve, echo)
            for _ in range(3):
                async with await anyio.connect_tcp(address, local_port) as client:
                    assert await echo_round(client, b"through the forward") == b"through the forward"
            group.cancel_scope.cancel()


# -- pipes and adapters without streams ----------------------------------------------------------


async def test_a_pipe_stream_reads_writes_half_closes_and_closes() -> None:
    to_us, from_them = os.pipe()
    to_them, from_us = os.pipe()
    for fd in (to_us, from_us):
        os.set_blocking(fd, False)
    pipe = PipeStream(to_us, from_us)
    os.write(from_them, b"in")
    assert await pipe.receive() == b"in"
    await pipe.send(b"out")
    assert os.read(to_them, 10) == b"out"
    await pipe.send_eof()
    assert os.read(to_them, 10) == b""
    with pytest.raises(anyio.ClosedResourceError):
        await pipe.send(b"late")
    os.close(from_them)
    with pytest.raises(anyio.EndOfStream):
        await pipe.receive()
    await pipe.aclose()
    with pytest.raises(anyio.ClosedResourceError):
        await pipe.receive()
    os.close(to_them)


async def test_a_pipe_stream_whose_reader_is_gone_is_broken() -> None:
    reader, writer = os.pipe()
    spare_reader, spare_writer = os.pipe()
    os.set_blocking(writer, False)
    pipe = PipeStream(spare_reader, writer)
    os.close(reader)
    with pytest.raises(anyio.BrokenResourceError):
        await pipe.send(b"nobody reads")
    await pipe.aclose()
    os.close(spare_writer)


async def test_the_sim_adapter_has_no_streams() -> None:
    adapter = SimAdapter()
    box = await adapter.create(oa.SandboxSpec())
    with pytest.raises(oa.ConfigError, match="no processes"):
        await box.open_stream(["cat"])
    with pytest.raises(oa.ConfigError, match="no processes"):
        await box.connect(80)
    await adapter.close()


async def test_a_forward_logs_a_connection_it_cannot_make(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bin_dir = tmp_path / "sh-only"
    bin_dir.mkdir()
    (bin_dir / "sh").symlink_to(shutil.which("sh") or "/bin/sh")
    box = HostSandbox(tmp_path, path=str(bin_dir))
    try:
        async with oa.forward(box, 80) as (address, local_port):
            with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                async with await anyio.connect_tcp(address, local_port) as client:
                    await client.receive()
    finally:
        await box.aclose()
    assert "python3 or nc" in caplog.text

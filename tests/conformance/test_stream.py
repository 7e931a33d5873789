"""Streams into a sandbox, on every adapter: a process's stdin and stdout (``open_stream``), a
TCP connection to its loopback (``connect``), httpx over it (``SandboxTransport``) and a port
on the controller's loopback (``forward``); the sandbox's network stays off all along.

The servers inside use only what every test image has: python3 where the image has it
(local, orchard/python:test), else busybox (``httpd``; ``nc -ll -e cat`` as an echo server).
"""

from __future__ import annotations

import hashlib
import os
import time

import anyio
import httpx
import pytest

import orchard_async as oa
from orchard_async.kit.streams import SandboxStream
from tests.conformance.test_attacks import CONNECT, run

BIG = 100 * 1024 * 1024  # the byte-exact transfer
ECHOED = 32 * 1024 * 1024
CHUNK = 256 * 1024
HTTP_PORT = 8765
ECHO_PORT = 8766
SERVER_WAIT = 30.0

HTTP_SERVER = f"""
if command -v python3 >/dev/null 2>&1; then
  (cd site && exec python3 -m http.server {HTTP_PORT} --bind 127.0.0.1 >/dev/null 2>&1 &)
else
  httpd -p 127.0.0.1:{HTTP_PORT} -h site
fi
"""
ECHO_SERVER = f"""
if command -v python3 >/dev/null 2>&1; then
  python3 -c '
import socket, threading
server = socket.create_server(("127.0.0.1", {ECHO_PORT}))
def echo(conn):
    while data := conn.recv(262144):
        conn.sendall(data)
    conn.close()
while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
' >/dev/null 2>&1 &
else
  nc -ll -p {ECHO_PORT} -e cat >/dev/null 2>&1 &
fi
"""
# The pids of relay processes (connect's, in python3 or in sh around nc) still alive. Matched
# in the shell, not by grep, whose own command line would hold the pattern.
RELAYS_ALIVE = r"""
for f in /proc/[0-9]*/cmdline; do
  c=$(tr '\0' ' ' <"$f" 2>/dev/null)
  case "$c" in *SHUT_WR*|*orchard-connect*) p=${f#/proc/}; echo "${p%/cmdline}" ;; esac
done
"""


def random_chunks(total: int) -> list[bytes]:
    block = os.urandom(1024 * 1024)
    # each chunk differs from the others, so a chunk lost or repeated changes the digest
    return [i.to_bytes(8, "big") + block[8 + i % 1024 : 8 + i % 1024 + CHUNK - 8] for i in range(total // CHUNK)]


async def send_all(stream: anyio.abc.ByteSendStream, chunks: list[bytes]) -> None:
    for chunk in chunks:
        await stream.send(chunk)


async def receive_digest(stream: anyio.abc.ByteReceiveStream, size: int) -> str:
    digest, received = hashlib.sha256(), 0
    while received < size:
        chunk = await stream.receive()
        digest.update(chunk)
        received += len(chunk)
    assert received == size, f"received {received} bytes, expected {size}"
    return digest.hexdigest()


async def both_ways(stream: anyio.abc.ByteStream, chunks: list[bytes]) -> None:
    """Send ``chunks`` while reading their echo; the echo must be byte-exact."""
    expected = hashlib.sha256(b"".join(chunks)).hexdigest()
    async with anyio.create_task_group() as group:
        group.start_soon(send_all, stream, chunks)
        assert await receive_digest(stream, sum(map(len, chunks))) == expected


async def alive(box: oa.Sandbox, pid: int) -> bool:
    """Whether the process runs in the sandbox (a zombie, killed but not yet reaped, does not)."""
    script = f'stat=$(cat /proc/{pid}/stat 2>/dev/null) || exit 1; case "$stat" in *") Z "*|*") X "*) exit 1;; esac'
    return (await box.exec(script, timeout=30)).exit_code == 0


async def wait_for_server(box: oa.Sandbox, port: int) -> SandboxStream:
    deadline = time.monotonic() + SERVER_WAIT
    while True:
        try:
            return await box.connect(port)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(0.1)


async def test_a_stream_to_a_process_echoes_100_mb_both_ways_and_its_process_ends_with_it(sandbox: oa.Sandbox) -> None:
    box = sandbox
    async with await box.open_stream(["cat"]) as stream:
        assert await alive(box, stream.pid), "the stream's process does not run in the sandbox"
        await stream.send(b"ping\n")
        assert await stream.receive() == b"ping\n"
        await both_ways(stream, random_chunks(BIG))
    assert not await alive(box, stream.pid), "closing the stream left its process running"


async def test_a_stream_reports_a_missing_program(sandbox: oa.Sandbox) -> None:
    box = sandbox
    with pytest.raises(FileNotFoundError, match="no-such-program"):
        await box.open_stream(["no-such-program", "--flag"])
    result = await box.exec("echo still here")
    assert result.text == "still here\n"


async def test_connect_to_a_port_nothing_listens_on_is_refused(sandbox: oa.Sandbox) -> None:
    box = sandbox
    with pytest.raises(ConnectionRefusedError):
        await box.connect(HTTP_PORT)


async def test_connect_echoes_both_ways(sandbox: oa.Sandbox) -> None:
    box = sandbox
    assert (await box.exec(ECHO_SERVER)).exit_code == 0
    async with await wait_for_server(box, ECHO_PORT) as connection:
        await both_ways(connection, random_chunks(ECHOED))
    assert not await alive(box, connection.pid)


async def test_an_http_server_inside_is_reached_by_connect_httpx_and_a_forward(sandbox: oa.Sandbox) -> None:
    box = sandbox
    prepared = await box.exec(
        f"mkdir -p site && echo hello >site/hello.txt && head -c {BIG} /dev/urandom >site/big && sha256sum site/big",
        timeout=120,
    )
    assert prepared.exit_code == 0, prepared.error_text
    big_digest = prepared.text.split()[0]
    assert (await box.exec(HTTP_SERVER)).exit_code == 0

    # connect: HTTP by hand
    async with await wait_for_server(box, HTTP_PORT) as connection:
        assert str(connection.pid) in (await box.exec(RELAYS_ALIVE)).text.split(), "the relay probe misses relays"
        await connection.send(b"GET /hello.txt HTTP/1.0\r\nHost: sandbox\r\n\r\n")
        response = b"".join([chunk async for chunk in connection])
    assert response.startswith(b"HTTP/1.") and response.endswith(b"\r\n\r\nhello\n"), response[:200]

    # httpx: a small page, then 100 MB streamed and checked byte for byte
    async with httpx.AsyncClient(transport=oa.SandboxTransport(box, HTTP_PORT)) as client:
        page = await client.get("http://sandbox/hello.txt")
        assert (page.status_code, page.text) == (200, "hello\n")
        digest, size = hashlib.sha256(), 0
        async with client.stream("GET", "http://sandbox/big") as download:
            async for chunk in download.aiter_raw():
                digest.update(chunk)
                size += len(chunk)
        assert (size, digest.hexdigest()) == (BIG, big_digest)
    assert (await box.exec(RELAYS_ALIVE)).text == "", "closing the httpx client left relay processes running"

    # a forward: a URL on the controller, up across many connections, some at once
    async with oa.forward(box, HTTP_PORT) as (host, port), httpx.AsyncClient(trust_env=False) as client:
        url = f"http://{host}:{port}/hello.txt"
        assert (await client.get(url)).text == "hello\n"
        pages: list[str] = []

        async def fetch() -> None:
            async with httpx.AsyncClient(trust_env=False) as own:  # a connection of its own
                pages.append((await own.get(url)).text)

        async with anyio.create_task_group() as group:
            for _ in range(4):
                group.start_soon(fetch)
        assert pages == ["hello\n"] * 4
        assert (await client.get(url)).text == "hello\n"

        # the sandbox itself still has no way out, not even to the forward's own port
        _, out = await run(box, CONNECT + f"_connect {host} {port}")
        assert "TOOL none" not in out, "no connect tool in the sandbox"
        assert "CONNECTED" not in out, f"the sandbox reached the controller's forward port: {out}"
    assert (await box.exec(RELAYS_ALIVE)).text == "", "closing the forward left relay processes running"

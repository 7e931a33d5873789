"""``WS /sandboxes/{id}/exec/pty`` as Orchard's clients speak it (orchard-env-api.md section 5):
init, ready, stdin, stdout (merged with stderr), signals, exit code; in-band close codes."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import httpx
import pytest

from orchard_async.apps.serve.app import REGISTRY
from orchard_async.apps.serve.keys import ANONYMOUS
from tests.service.conftest import KEY_A, Service, make_sandbox


async def session_of(service: Service, sandbox_id: str, init: dict[str, Any], key: str | None = None):
    query = f"?api_key={key}" if key else ""
    http = aiohttp.ClientSession()
    ws = await http.ws_connect(f"{service.url.replace('http', 'ws')}/sandboxes/{sandbox_id}/exec/pty{query}")
    await ws.send_json({"type": "init", "env": {}, "cwd": None, "rows": 24, "cols": 80, "login_shell": False, **init})
    return http, ws


async def run_to_exit(ws: aiohttp.ClientWebSocketResponse, stdin: list[bytes] = ()) -> tuple[bytes, int]:
    ready = await ws.receive_json(timeout=10)
    assert ready["type"] == "ready" and isinstance(ready["pid"], int), ready
    for data in stdin:
        await ws.send_json({"type": "stdin", "data": base64.b64encode(data).decode()})
    out = b""
    while True:
        frame = await ws.receive_json(timeout=30)
        if frame["type"] == "stdout":
            out += base64.b64decode(frame["data"])
        elif frame["type"] == "exit":
            return out, frame["code"]
        else:
            raise AssertionError(frame)


@pytest.fixture
async def pty_sandbox(service: Service, client: httpx.AsyncClient) -> str:
    sandbox_id = await make_sandbox(client)
    if not hasattr(service.app[REGISTRY].get(ANONYMOUS, sandbox_id).sandbox, "open_stream"):
        pytest.skip("this build's local adapter has no open_stream")
    return sandbox_id


async def test_stdin_stdout_and_exit_code(service: Service, pty_sandbox: str) -> None:
    init = {"cmd": ["sh", "-c", "read line; echo got $line; echo to-stderr >&2; exit 3"]}
    http, ws = await session_of(service, pty_sandbox, init)
    async with http, ws:
        out, code = await run_to_exit(ws, [b"hello\n"])
    assert out == b"got hello\nto-stderr\n" and code == 3


async def test_env_and_cwd(service: Service, pty_sandbox: str) -> None:
    init = {"cmd": ["sh", "-c", 'echo "$GREETING from $(pwd)"'], "env": {"GREETING": "hi"}, "cwd": "/workspace"}
    http, ws = await session_of(service, pty_sandbox, init)
    async with http, ws:
        out, code = await run_to_exit(ws)
    workdir = service.app[REGISTRY].get(ANONYMOUS, pty_sandbox).sandbox.workdir  # /workspace, or local's own
    assert (out, code) == (f"hi from {workdir}\n".encode(), 0)


async def test_signal_ends_the_process(service: Service, pty_sandbox: str) -> None:
    http, ws = await session_of(service, pty_sandbox, {"cmd": ["sleep", "300"]})
    async with http, ws:
        assert (await ws.receive_json(timeout=10))["type"] == "ready"
        await ws.send_json({"type": "signal", "sig": "TERM"})
        frame = await ws.receive_json(timeout=30)
    assert frame == {"type": "exit", "code": 143}


async def test_close_codes(start_service) -> None:
    service = await start_service(keys=True)
    async with service.client(KEY_A) as a:
        sandbox_id = await make_sandbox(a)
    for key, target, code in [(None, sandbox_id, 4401), ("wrong", sandbox_id, 4401), (KEY_A, "unknown", 4404)]:
        http, ws = await session_of(service, target, {"cmd": ["true"]}, key)
        async with http, ws:
            await ws.receive(timeout=10)
        assert ws.close_code == code

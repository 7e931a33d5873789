"""``WS /sandboxes/{id}/exec/pty``: Orchard's interactive process protocol (JSON text frames,
data in base64; orchard-env-api.md section 5).

Authentication and lookup answer in-band, as Orchard does: the socket is accepted, then
closed with 4401 (no or bad key), 4404 (unknown sandbox), 4409 (not ready). A first frame
that is not an ``init`` object gets an ``error`` frame and close code 4400.

The process runs over the sandbox's byte stream (``Sandbox.open_stream``); an adapter whose
sandboxes run no processes refuses it (close code 4501). It is not a terminal: stdin and stdout are pipes (stderr merged into stdout),
``rows``/``cols``/``resize`` are accepted and ignored.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from typing import Any

import anyio
from aiohttp import WSMsgType, web

from orchard_async.apps.serve.schema import ApiError
from orchard_async.errors import ConfigError
from orchard_async.kit.shell import quote

MAX_FRAME = 4 << 20
INIT_TIMEOUT = 30.0
SIGNALS = {"TERM", "KILL", "INT", "HUP"}

# `$1` the exit marker's nonce, then the program: run it with stderr on stdout, then say how it
# ended (the bridge strips the marker, found by its nonce, and turns it into the exit frame).
# The marker follows the output directly, with no newline of its own before it: the bridge holds
# back only what may be the marker's start, and a held newline would delay every line a
# program prints until its next output (a prompt, a stream's reply).
# The program's redirection is made inside a subshell: dash applies a command's redirections
# in the shell itself while it waits, and would print "Terminated" (a killed child) into the
# output; the runner's own stderr goes nowhere.
RUNNER = 'n=$1; shift; exec 2>/dev/null; (exec "$@" 2>&1); c=$?; printf "@@EXIT %s %s\\n" "$n" "$c"'


async def handle(request: web.Request) -> web.WebSocketResponse:
    from orchard_async.apps.serve.app import REGISTRY, TENANT, tenant_of  # the app imports this module

    ws = web.WebSocketResponse(max_msg_size=MAX_FRAME, heartbeat=30)
    await ws.prepare(request)
    key = request.query.get("api_key") or request.headers.get("X-API-Key")
    try:
        tenant = tenant_of(request, key)
    except ApiError as exc:
        await ws.close(code=4401, message=exc.detail.encode()[:120])
        return ws
    request[TENANT] = tenant
    try:
        box = request.app[REGISTRY].get(tenant, request.match_info["id"])
    except ApiError:
        await ws.close(code=4404, message=b"sandbox not found")
        return ws
    if box.sandbox is None:
        await ws.close(code=4409, message=b"sandbox not ready")
        return ws
    init = await _init_frame(ws)
    if init is None:
        return ws
    await _bridge(ws, box, init)
    return ws


async def _fail(ws: web.WebSocketResponse, message: str, code: int) -> None:
    await ws.send_json({"type": "error", "message": message})
    await ws.close(code=code, message=message.encode()[:120])


async def _init_frame(ws: web.WebSocketResponse) -> dict[str, Any] | None:
    """The client's first frame, checked; None after answering an error."""
    try:
        message = await asyncio.wait_for(ws.receive(), timeout=INIT_TIMEOUT)
    except TimeoutError:
        await _fail(ws, f"no init frame within {INIT_TIMEOUT:g}s", 4400)
        return None
    if message.type is not WSMsgType.TEXT:
        await _fail(ws, "the first frame must be a JSON text frame of type init", 4400)
        return None
    try:
        init = json.loads(message.data)
    except ValueError:
        await _fail(ws, "the init frame is not JSON", 4400)
        return None
    cmd = init.get("cmd") if isinstance(init, dict) else None
    if not isinstance(init, dict) or init.get("type") != "init":
        await _fail(ws, 'the first frame must be {"type": "init", "cmd": [...]}', 4400)
        return None
    if isinstance(cmd, str):
        cmd = ["bash", "-c", cmd]
    env = init.get("env") or {}
    if not (isinstance(cmd, list) and cmd and all(isinstance(word, str) for word in cmd)):
        await _fail(ws, "init.cmd must be a non-empty list of strings (or a string)", 4400)
        return None
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        await _fail(ws, "init.env must map names to strings", 4400)
        return None
    if init.get("cwd") is not None and not isinstance(init["cwd"], str):
        await _fail(ws, "init.cwd must be a string or null", 4400)
        return None
    return {**init, "cmd": cmd, "env": env}


def _argv(box: Any, init: dict[str, Any], nonce: str) -> list[str]:
    """The stream's command: the runner in ``cwd`` with ``env``, through a login shell if asked."""
    program = init["cmd"]
    if init.get("login_shell"):
        program = ["sh", "-l", "-c", 'exec "$@"', "sh", *program]
    exports = "".join(f"export {name}={quote(value)}; " for name, value in init["env"].items())
    cd = f"cd -- {quote(box.path(init['cwd']))} 2>/dev/null || cd /; " if init.get("cwd") else ""
    return ["sh", "-c", cd + exports + RUNNER, "orchard-pty", nonce, *program]


async def _bridge(ws: web.WebSocketResponse, box: Any, init: dict[str, Any]) -> None:
    nonce = secrets.token_hex(8)
    try:
        stream = await box.sandbox.open_stream(_argv(box, init, nonce))
    except ConfigError as exc:  # a backend that runs no processes (sim) refuses every stream
        await _fail(
            ws, f"this service's adapter gives no byte stream into a sandbox, so it cannot run a PTY ({exc})", 4501
        )
        return
    except Exception as exc:  # noqa: BLE001 - reported to the client in its protocol
        await _fail(ws, f"could not start {init['cmd'][0]}: {exc}", 4500)
        return
    marker = f"@@EXIT {nonce} ".encode()
    exit_code = -1
    try:
        await ws.send_json({"type": "ready", "pid": stream.pid})
        async with anyio.create_task_group() as tg:

            async def pump_out() -> None:
                nonlocal exit_code
                held = b""  # output that may be the start of the exit marker, not sent yet
                while True:
                    try:
                        held += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                        break
                    out, held = split_marker(held, marker)
                    await _send_out(ws, out)
                    if held.startswith(marker) and b"\n" in held[len(marker) :]:
                        code = held[len(marker) :].split(b"\n", 1)[0]
                        exit_code = int(code) if code.isdigit() else -1
                        held = b""
                        break
                await _send_out(ws, held)
                await ws.send_json({"type": "exit", "code": exit_code})
                tg.cancel_scope.cancel()

            async def pump_in() -> None:
                async for message in ws:
                    if message.type is not WSMsgType.TEXT:
                        continue
                    try:
                        frame = json.loads(message.data)
                    except ValueError:
                        await ws.send_json({"type": "error", "message": "frames must be JSON"})
                        continue
                    kind = frame.get("type") if isinstance(frame, dict) else None
                    if kind == "stdin":
                        await stream.send(base64.b64decode(frame.get("data", "")))
                    elif kind == "signal" and frame.get("sig") in SIGNALS:
                        await box.sandbox.exec(_signal_children(stream.pid, frame["sig"]), timeout=10)
                    elif kind == "eof":
                        await stream.send_eof()
                tg.cancel_scope.cancel()  # the client went away: end the process

            tg.start_soon(pump_out)
            tg.start_soon(pump_in)
    finally:
        with anyio.CancelScope(shield=True):
            await stream.aclose()
            if not ws.closed:
                await ws.close()


def split_marker(data: bytes, marker: bytes) -> tuple[bytes, bytes]:
    """(what can be sent, what is held back): from the exit marker on, or the longest end
    of ``data`` that could be the marker's beginning. Everything else goes out at once, so
    an interactive program's prompt is seen before it waits for input."""
    at = data.find(marker)
    if at >= 0:
        return data[:at], data[at:]
    for size in range(min(len(marker) - 1, len(data)), 0, -1):
        if marker.startswith(data[-size:]):
            return data[:-size], data[-size:]
    return data, b""


async def _send_out(ws: web.WebSocketResponse, data: bytes) -> None:
    if data:
        await ws.send_json({"type": "stdout", "data": base64.b64encode(data).decode()})


def _signal_children(pid: int, sig: str) -> str:
    """Signal what the runner shell started (the program), not the runner itself; a signal
    sent just after ``ready`` may come before the runner has forked it: wait for it (5 s)."""
    return (
        f"i=0; while [ $i -lt 100 ]; do c=$(cat /proc/{pid}/task/{pid}/children 2>/dev/null); "
        f'if [ -n "$c" ]; then kill -{sig} $c 2>/dev/null; break; fi; '
        f"kill -0 {pid} 2>/dev/null || break; sleep 0.05; i=$((i+1)); done"
    )

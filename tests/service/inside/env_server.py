"""An OpenEnv-style environment server with an MCP endpoint, on the standard library only, so
it runs with any image's python3 (busybox has none; orchard/python:test has no packages):
what the exposure tests start inside a no-network sandbox.

    python3 env_server.py PORT

OpenEnv's wire format (openenv-core's ``EnvClient``/``GenericEnvClient`` drive it): ``GET
/health``; ``POST /reset``, ``POST /step`` and ``GET /state`` over HTTP; the same over a
WebSocket at ``/ws`` (``{"type": "reset"|"step"|"state"|"close", "data": ...}`` answered by
``{"type": "observation"|"state", "data": ...}``). The environment echoes: a step's
``message`` comes back in its observation, its reward is the message's length.

MCP (streamable HTTP, JSON answers): ``POST /mcp`` takes JSON-RPC (``initialize``,
``tools/list``, ``tools/call`` of one tool, ``echo``); a notification is answered 202.
Also ``GET /big?n=BYTES`` (a large chunked body) and ``GET /headers`` (the request's
headers, to check what a proxy passes on).
"""

import asyncio
import base64
import hashlib
import json
import struct
import sys
from urllib.parse import parse_qs, urlsplit

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Env:
    def __init__(self):
        self.steps = 0
        self.episode = 0

    def reset(self, data):
        self.steps = 0
        self.episode += 1
        return {"observation": {"message": "ready", "episode": self.episode}, "reward": None, "done": False}

    def step(self, action):
        self.steps += 1
        message = str((action or {}).get("message", ""))
        return {"observation": {"message": message, "step": self.steps}, "reward": float(len(message)), "done": False}

    def state(self):
        return {"episode_id": str(self.episode), "step_count": self.steps}


def mcp_answer(request):
    method, ident = request.get("method"), request.get("id")
    if method == "initialize":
        result = {
            "protocolVersion": request.get("params", {}).get("protocolVersion", "2025-03-26"),
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "env-server", "version": "1"},
        }
    elif method == "tools/list":
        schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        result = {"tools": [{"name": "echo", "description": "echo the text", "inputSchema": schema}]}
    elif method == "tools/call":
        text = request.get("params", {}).get("arguments", {}).get("text", "")
        result = {"content": [{"type": "text", "text": "echo: " + text}], "isError": False}
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no method " + str(method)}}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return method, target, headers


async def read_body(reader, headers):
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return body
            body += chunk[:-2]
    return await reader.readexactly(int(headers.get("content-length", "0")))


def answer(writer, status, payload, content_type="application/json"):
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    reason = {200: "OK", 202: "Accepted", 404: "Not Found", 405: "Method Not Allowed"}.get(status, "X")
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)


async def ws_frames(reader):
    """Client frames (masked), as (opcode, payload); continuation frames joined."""
    message, first_opcode = b"", 0
    while True:
        b0, b1 = await reader.readexactly(2)
        opcode, fin, length = b0 & 0x0F, b0 & 0x80, b1 & 0x7F
        if length == 126:
            (length,) = struct.unpack(">H", await reader.readexactly(2))
        elif length == 127:
            (length,) = struct.unpack(">Q", await reader.readexactly(8))
        mask = await reader.readexactly(4) if b1 & 0x80 else b"\0\0\0\0"
        data = bytearray(await reader.readexactly(length))
        for i in range(length):
            data[i] ^= mask[i % 4]
        if opcode >= 8:  # control frames stand alone
            yield opcode, bytes(data)
            continue
        message += data
        first_opcode = first_opcode or opcode
        if fin:
            yield first_opcode, message
            message, first_opcode = b"", 0


def ws_frame(opcode, payload):
    length = len(payload)
    if length < 126:
        head = struct.pack(">BB", 0x80 | opcode, length)
    elif length < 65536:
        head = struct.pack(">BBH", 0x80 | opcode, 126, length)
    else:
        head = struct.pack(">BBQ", 0x80 | opcode, 127, length)
    return head + payload


async def websocket(reader, writer, headers, env):
    accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + WS_GUID).digest()).decode()
    writer.write(
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept}\r\n\r\n"
        ).encode()
    )
    async for opcode, payload in ws_frames(reader):
        if opcode == 8:  # close: answer with the same code
            writer.write(ws_frame(8, payload[:2]))
            break
        if opcode == 9:
            writer.write(ws_frame(10, payload))
            continue
        if opcode == 2:  # binary: echoed back, reversed
            writer.write(ws_frame(2, payload[::-1]))
            continue
        if opcode != 1:
            continue
        message = json.loads(payload)
        kind = message.get("type")
        if kind == "close":
            writer.write(ws_frame(8, struct.pack(">H", 1000)))
            break
        if kind == "bye":  # close with a code of the server's own choosing
            writer.write(ws_frame(8, struct.pack(">H", 4200) + b"bye"))
            break
        if kind == "reset":
            reply = {"type": "observation", "data": env.reset(message.get("data"))}
        elif kind == "step":
            reply = {"type": "observation", "data": env.step(message.get("data"))}
        elif kind == "state":
            reply = {"type": "state", "data": env.state()}
        elif kind == "mcp":
            reply = {"type": "mcp", "data": mcp_answer(message.get("data") or {})}
        else:
            reply = {"type": "error", "data": {"message": "unknown type " + str(kind), "code": "UNKNOWN_TYPE"}}
        writer.write(ws_frame(1, json.dumps(reply).encode()))
        await writer.drain()


async def connection(reader, writer):
    env = Env()  # one session per connection, as OpenEnv's WebSocket sessions
    try:
        while True:
            try:
                method, target, headers = await read_head(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            path, query = urlsplit(target).path, parse_qs(urlsplit(target).query)
            if headers.get("upgrade", "").lower() == "websocket":
                if path in ("/ws", "/mcp"):
                    await websocket(reader, writer, headers, env)
                else:
                    answer(writer, 404, {"detail": "no websocket at " + path})
                return
            body = await read_body(reader, headers)
            if path == "/health":
                answer(writer, 200, {"status": "healthy"})
            elif path == "/reset" and method == "POST":
                answer(writer, 200, env.reset(json.loads(body or b"{}")))
            elif path == "/step" and method == "POST":
                answer(writer, 200, env.step(json.loads(body).get("action")))
            elif path == "/state":
                answer(writer, 200, env.state())
            elif path == "/headers":
                answer(writer, 200, {"path": target, "method": method, "headers": headers})
            elif path == "/big":
                size = int(query.get("n", ["1048576"])[0])
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                sent = 0
                while sent < size:
                    part = min(65536, size - sent)
                    writer.write(b"%x\r\n" % part + bytes([sent % 251]) * part + b"\r\n")
                    sent += part
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
            elif path == "/mcp" and method == "POST":
                request = json.loads(body)
                if "id" not in request:  # a notification
                    answer(writer, 202, b"")
                else:
                    answer(writer, 200, mcp_answer(request))
            elif path == "/mcp":
                answer(writer, 405, {"detail": "no event stream"})
            else:
                answer(writer, 404, {"detail": "not found: " + path})
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def main(port):
    server = await asyncio.start_server(connection, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))

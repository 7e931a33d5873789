"""The Claw services as an MCP server over stdio, for harnesses that speak the Model Context
Protocol. Standard library only; started by the harness as a subprocess: `claw mcp`.

The stdio transport: one JSON-RPC 2.0 message per line on stdin and stdout (no embedded
newlines), logs on stderr. Served: ``initialize`` (then the client's ``notifications/initialized``),
``ping``, ``tools/list`` and ``tools/call``. Each tool of the task is a tool named
``service__tool`` (``mail__send``; ``agent__answer`` gives the final answer), its
``inputSchema`` the catalogue's JSON Schema. A call goes to the same audited services as the CLI
and HTTP (audited with ``via: mcp``): its result is one text content with the JSON reply;
a refused or failed call is ``isError: true`` with the error and its status (429/500 are
temporary: call again). Requests the server does not know get the JSON-RPC error -32601.
"""

import json
import sys

import claw_cli

PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")  # handshake revisions served
SERVER_INFO = {"name": "claw-services", "version": "1.0"}

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602


def mcp_name(name):
    return name.replace(".", "__")


def tool_list(catalogue):
    return [
        {"name": mcp_name(entry["name"]), "description": entry["description"], "inputSchema": entry["parameters"]}
        for entry in catalogue.values()
    ]


def call_tool(catalogue, params):
    """The ``tools/call`` result, or raises ValueError for a request that names no tool."""
    name = params.get("name")
    arguments = params.get("arguments")
    if not isinstance(name, str):
        raise ValueError("tools/call needs a tool name")
    if arguments is not None and not isinstance(arguments, dict):
        raise ValueError("tools/call arguments must be an object")
    qualified = name.replace("__", ".")
    if qualified not in catalogue:
        # an unknown tool is the agent's mistake: a result it can read, not a protocol failure
        text = f"unknown tool {name!r}; tools/list lists this task's tools"
        return {"content": [{"type": "text", "text": text}], "isError": True}
    status, reply = claw_cli.call(qualified, arguments or {}, via="mcp")
    if status == 200:
        text = json.dumps(reply.get("result"), ensure_ascii=False)
        return {"content": [{"type": "text", "text": text}], "isError": False}
    error = reply.get("error", "") if isinstance(reply, dict) else str(reply)
    temporary = " (temporary: call the tool again)" if status in (429, 500, 502, 503) else ""
    text = "error {}: {}{}".format(status or "unreachable", error, temporary)
    return {"content": [{"type": "text", "text": text}], "isError": True}


def handle(message, catalogue):
    """The reply to one message (None for a notification)."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        return error_reply(
            message.get("id") if isinstance(message, dict) else None, INVALID_REQUEST, "not JSON-RPC 2.0"
        )
    method, params, request_id = message["method"], message.get("params") or {}, message.get("id")
    if "id" not in message:  # a notification (initialized, cancelled...): nothing to answer
        return None
    if not isinstance(params, dict):
        return error_reply(request_id, INVALID_PARAMS, "params must be an object")
    if method == "initialize":
        asked = params.get("protocolVersion")
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[-1]
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": SERVER_INFO,
            "instructions": "Tools of the user's services; call agent__answer with your final answer.",
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": tool_list(catalogue)}
    elif method == "tools/call":
        try:
            result = call_tool(catalogue, params)
        except ValueError as exc:
            return error_reply(request_id, INVALID_PARAMS, str(exc))
    else:
        return error_reply(request_id, METHOD_NOT_FOUND, "method not found: " + method)
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_reply(request_id, code, message):
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def serve(stdin=None, stdout=None):
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    catalogue = claw_cli.catalogue()
    for line in stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError as exc:
            reply = error_reply(None, PARSE_ERROR, f"parse error: {exc}")
        else:
            reply = handle(message, catalogue)
        if reply is not None:
            stdout.write(json.dumps(reply, ensure_ascii=False) + "\n")
            stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve())

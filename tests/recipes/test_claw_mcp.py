"""The Claw services over MCP (stdio JSON-RPC): a real MCP client (the `mcp` package from PyPI)
runs inside a local sandbox, as a harness would, starts `claw mcp` as its stdio server, lists
the task's tools and calls them; the calls land in the same audit as the CLI's. The raw
protocol's error replies are checked by feeding `claw mcp` lines directly."""

from __future__ import annotations

import json

import anyio

import orchard_async as oa
from orchard_async.adapters.local import LocalAdapter
from orchard_async.recipes.claw import services
from tests.conftest import backend_missing

WORLD = {
    "mail": {"inbox": [{"id": "m1", "from": "dana@example.com", "subject": "1:1", "body": "Move it?", "unread": True}]},
    "todo": {"items": [{"id": "t1", "title": "Renew passport", "done": False}]},
}
TOOLS = ["mail.list", "mail.read", "todo.list", "todo.complete"]

# A harness-side client: what an MCP-speaking agent does, printed as one JSON line.
CLIENT = r"""
import json, anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

def text(result):
    return result.content[0].text

def is_error(result):
    return getattr(result, "is_error", getattr(result, "isError", None))

async def main():
    params = StdioServerParameters(command="claw", args=["mcp"])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            listed = await session.list_tools()
            out = {
                "server": getattr(init, "server_info", getattr(init, "serverInfo", None)).name,
                "tools": sorted(t.name for t in listed.tools),
                "schema": [getattr(t, "input_schema", getattr(t, "inputSchema", None)) for t in listed.tools
                           if t.name == "todo__complete"][0],
            }
            unread = await session.call_tool("mail__list", {"unread": True})
            out["unread"] = [m["id"] for m in json.loads(text(unread))]
            first = await session.call_tool("todo__complete", {"id": "t1"})  # the injected 500
            again = await session.call_tool("todo__complete", {"id": "t1"})
            out["fault"] = [is_error(first), text(first), is_error(again), json.loads(text(again))["done"]]
            bad = await session.call_tool("todo__complete", {"id": 7})
            unknown = await session.call_tool("mail__send", {"to": "x"})
            out["refused"] = [is_error(bad), text(bad), is_error(unknown), text(unknown)]
            answer = await session.call_tool("agent__answer", {"text": "t1 is done"})
            out["answer"] = is_error(answer)
    print(json.dumps(out))

anyio.run(main)
"""

RAW_LINES = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2024-11-05"}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "resources/list"},
    {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"arguments": {}}},
    {"jsonrpc": "2.0", "id": 4, "method": "ping"},
]


def test_a_real_mcp_client_drives_the_services_over_stdio(tmp_path) -> None:
    try:
        import mcp  # noqa: F401  (the client runs in the sandbox, on this interpreter)
    except ImportError as exc:
        backend_missing(f"the mcp package: {exc}; pip install -e '.[mcp]'")

    async def main() -> tuple[dict, list[dict], services.Snapshot]:
        adapter = LocalAdapter(root=tmp_path)
        try:
            spec = oa.SandboxSpec(env={"PATH": services.SANDBOX_PATH})
            async with await adapter.create(spec) as box:
                faults = {"fail_first": {"todo.complete": 1}, "statuses": [500]}
                handle = await services.start(box, world=WORLD, tools=TOOLS, faults=faults)
                await box.write_file("client.py", CLIENT)
                client = await box.exec("python3 client.py", timeout=60)
                assert client.ok, client.error_text
                snap = await services.snapshot(box, handle)
                lines = "not json\n" + "".join(json.dumps(line) + "\n" for line in RAW_LINES)
                raw = await box.exec("claw mcp", stdin=lines.encode(), timeout=30)
                assert raw.ok, raw.error_text
                return json.loads(client.text), [json.loads(line) for line in raw.text.splitlines()], snap
        finally:
            await adapter.close()

    out, raw, snap = anyio.run(main)
    assert out["server"] == "claw-services"
    assert out["tools"] == ["agent__answer", "mail__list", "mail__read", "todo__complete", "todo__list"]
    assert out["schema"]["required"] == ["id"] and out["schema"]["properties"]["id"]["type"] == "string"
    assert out["unread"] == ["m1"]
    faulted, fault_text, retried, done = out["fault"]
    assert faulted is True and "error 500" in fault_text and "temporary" in fault_text
    assert (retried, done) == (False, True)
    bad, bad_text, unknown, unknown_text = out["refused"]
    assert bad is True and "must be a string" in bad_text
    assert unknown is True and "unknown tool 'mail__send'" in unknown_text
    assert out["answer"] is False

    # the calls are audited like any other, marked as made over MCP; the unknown tool never reached the services
    assert snap.trusted
    assert [(e["tool"], e["status"], e["via"]) for e in snap.audit] == [
        ("mail.list", 200, "mcp"),
        ("todo.complete", 500, "mcp"),
        ("todo.complete", 200, "mcp"),
        ("todo.complete", 400, "mcp"),
        ("agent.answer", 200, "mcp"),
    ]
    assert snap.world["answer"] == "t1 is done"

    # the raw protocol: a parse error, a notification unanswered, unknown method, bad params, ping
    assert [r.get("id") for r in raw] == [None, 1, 2, 3, 4]
    assert raw[0]["error"]["code"] == -32700
    assert raw[1]["result"]["protocolVersion"] == "2024-11-05" and "tools" in raw[1]["result"]["capabilities"]
    assert raw[2]["error"]["code"] == -32601 and raw[3]["error"]["code"] == -32602
    assert raw[4]["result"] == {}

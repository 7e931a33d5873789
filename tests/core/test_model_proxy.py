"""The recording model proxy against a scripted upstream (aiohttp, in this event loop): plain
and streamed chat completions pass through byte for byte and are recorded; unknown keys and
spent budgets are refused; and a sandbox reaches the proxy over one stream (local adapter)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

import orchard_async as oa
from orchard_async.adapters.local import LocalAdapter
from orchard_async.models.proxy import ModelProxy, StreamAssembler, Upstream, serve_into

TOOL_CALL_CHUNKS = [
    {"id": "c1", "model": "served", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me "}}]},
    {"id": "c1", "choices": [{"index": 0, "delta": {"content": "look."}}]},
    {
        "id": "c1",
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "mail__", "arguments": ""},
                        }
                    ]
                },
            }
        ],
    },
    {"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "list"}}]}}]},
    {
        "id": "c1",
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"unread": true}'}}]}}
        ],
    },
    {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"id": "c1", "choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 7, "total_tokens": 47}},
]


def sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


class Upstreams:
    """A scripted OpenAI-compatible server: what it received, and replies by turn."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, Any], str]] = []  # (body, authorization)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append((body, request.headers.get("Authorization", "")))
        if body.get("stream"):
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            data = sse(TOOL_CALL_CHUNKS)
            for start in range(0, len(data), 50):  # in pieces that cut lines and events
                await out.write(data[start : start + 50])
            await out.write_eof()
            return out
        if body["messages"][-1]["content"] == "fail":
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        turn = len(self.received)
        return web.json_response(
            {
                "id": f"r{turn}",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": f"reply {turn}"}}],
                "usage": {"prompt_tokens": 10 * turn, "completion_tokens": 2, "total_tokens": 10 * turn + 2},
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "upstream-a"}, {"id": "upstream-b"}]})


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstreams, str]]:
    scripted = Upstreams()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", scripted.chat)
    app.router.add_get("/v1/models", scripted.models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield scripted, f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "whatever", "messages": [{"role": "user", "content": content}], **extra}


async def test_plain_calls_are_forwarded_and_recorded(upstream: tuple[Upstreams, str]) -> None:
    scripted, url = upstream
    async with ModelProxy(Upstream(url, api_key="sk-real", model="served")) as proxy:
        session = proxy.open_session("ep-1")
        other = proxy.open_session("ep-2")
        headers = {"Authorization": f"Bearer {session.key}"}
        async with httpx.AsyncClient(base_url=proxy.base_url, headers=headers) as client:
            first = await client.post("/chat/completions", json=chat("hello"))
            second = await client.post("/chat/completions", json=chat("again"))
            failed = await client.post("/chat/completions", json=chat("fail"))
        calls = proxy.close_session(session)
    assert first.json()["choices"][0]["message"]["content"] == "reply 1"
    assert second.json()["usage"]["prompt_tokens"] == 20
    assert failed.status_code == 503  # the upstream's failure reaches the harness as it was
    # the upstream sees the real key and the configured model; the sandbox only ever had the session key
    assert [auth for _, auth in scripted.received] == ["Bearer sk-real"] * 3
    assert [body["model"] for body, _ in scripted.received] == ["served"] * 3
    assert [call.index for call in calls] == [0, 1, 2]
    assert calls[0].request["messages"] == [{"role": "user", "content": "hello"}]
    assert calls[1].response["choices"][0]["message"]["content"] == "reply 2"
    assert calls[1].usage == {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22}
    assert calls[2].status == 503 and calls[2].usage == {}
    assert all(call.latency_s > 0 for call in calls)
    assert other.calls == []  # another episode's session saw none of it


async def test_streamed_calls_pass_through_and_are_reassembled(upstream: tuple[Upstreams, str]) -> None:
    _, url = upstream
    async with ModelProxy(Upstream(url)) as proxy:
        session = proxy.open_session("ep")
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {session.key}"}) as client:
            async with client.stream("POST", proxy.base_url + "/chat/completions", json=chat("hi", stream=True)) as r:
                received = b"".join([part async for part in r.aiter_bytes()])
        (call,) = proxy.close_session(session)
    assert received == sse(TOOL_CALL_CHUNKS)
    assert call.stream and call.chunks == len(TOOL_CALL_CHUNKS)
    message = call.response["choices"][0]["message"]
    assert message["content"] == "Let me look."
    assert message["tool_calls"] == [
        {"id": "call_a", "type": "function", "function": {"name": "mail__list", "arguments": '{"unread": true}'}}
    ]
    assert call.response["choices"][0]["finish_reason"] == "tool_calls"
    assert call.usage == {"prompt_tokens": 40, "completion_tokens": 7, "total_tokens": 47}
    assert call.first_token_s is not None and call.first_token_s <= call.latency_s


def test_assembler_ignores_noise() -> None:
    assembler = StreamAssembler()
    assembler.feed(b": keep-alive\n\ndata: {not json\n\nevent: x\ndata: ")
    assembler.feed(b'{"choices": [{"index": 0, "delta": {"content": "ok"}}]}\n\ndata: [DONE]\n\n')
    assert assembler.chunks == 1
    assert assembler.result()["choices"][0]["message"]["content"] == "ok"


async def test_unknown_keys_revoked_keys_and_spent_budgets_are_refused(upstream: tuple[Upstreams, str]) -> None:
    scripted, url = upstream
    async with ModelProxy(Upstream(url)) as proxy:
        session = proxy.open_session("ep", max_calls=1)
        async with httpx.AsyncClient(base_url=proxy.base_url) as client:
            stranger = await client.post("/chat/completions", json=chat("x"), headers={"Authorization": "Bearer nope"})
            mine = {"Authorization": f"Bearer {session.key}"}
            ok = await client.post("/chat/completions", json=chat("x"), headers=mine)
            over = await client.post("/chat/completions", json=chat("y"), headers=mine)
            models = await client.get("/models", headers=mine)
            proxy.close_session(session)
            revoked = await client.post("/chat/completions", json=chat("z"), headers=mine)
    assert stranger.status_code == 401 and revoked.status_code == 401
    assert ok.status_code == 200
    assert over.status_code == 400 and "budget" in over.json()["error"]["message"]
    assert session.refused == 1 and len(session.calls) == 1
    assert len(scripted.received) == 1  # refused calls never reach the upstream
    assert [m["id"] for m in models.json()["data"]] == ["upstream-a", "upstream-b"]


# A client inside the sandbox: one plain call, one streamed call (urllib, stdlib only).
SANDBOX_CLIENT = r"""
import json, os, sys, urllib.request
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def post(body):
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Bearer " + key)
    with opener.open(req, timeout=30) as reply:
        return reply.read()
plain = json.loads(post({"model": "m", "messages": [{"role": "user", "content": "from the sandbox"}]}))
streamed = post({"model": "m", "stream": True, "messages": [{"role": "user", "content": "stream it"}]})
print(plain["choices"][0]["message"]["content"])
print(streamed.count(b"data: "))
"""


async def test_a_sandbox_reaches_the_proxy_over_a_stream(upstream: tuple[Upstreams, str], tmp_path) -> None:
    _, url = upstream
    adapter = LocalAdapter(root=tmp_path / "root")
    try:
        async with ModelProxy(Upstream(url, model="served")) as proxy, await adapter.create(oa.SandboxSpec()) as box:
            session = proxy.open_session("ep")
            await box.write_file("client.py", SANDBOX_CLIENT)
            async with serve_into(box, proxy.port) as port:
                env = {"OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": session.key}
                result = await box.exec("python3 client.py", env=env, timeout=60)
            calls = proxy.close_session(session)
    finally:
        await adapter.close()
    assert result.ok, result.text + result.error_text
    assert result.text.split() == ["reply", "1", str(len(TOOL_CALL_CHUNKS) + 1)]
    assert [call.request["messages"][0]["content"] for call in calls] == ["from the sandbox", "stream it"]
    assert calls[1].response["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "mail__list"

"""Harness mode records tokens: the recording proxy with ``Upstream(tokens=True)`` asks a
vLLM-shaped backend (a stand-in written from its documented chat-completions fields:
``return_token_ids`` -> ``prompt_token_ids`` and ``choices[].token_ids``, ``logprobs`` ->
``logprobs.content[].logprob``) for ids and logprobs, keeps them per call (plain and streamed),
and ``stitch_calls`` joins calls that extend each other into one sequence."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from orchard_async.models.proxy import ModelProxy, Upstream, stitch_calls

END = 2


def ids_of(messages: list[dict[str, Any]]) -> list[int]:
    """The stand-in's chat template: one id per character of role and content, 1 and END around each."""
    ids: list[int] = []
    for message in messages:
        ids += [1, *(ord(c) for c in message["role"] + "\n" + message["content"]), END, 10]
    return [*ids, 1, *(ord(c) for c in "assistant\n")]


class Backend:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        reply = "ok " + str(len(self.bodies))
        sampled = [ord(c) for c in reply] + [END]
        logprobs = [-0.1 * (i + 1) for i in range(len(sampled))]
        prompt = ids_of(body["messages"])
        with_ids = body.get("return_token_ids")
        entries = [
            {"token": f"t{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(sampled, logprobs, strict=True)
        ]
        if body.get("stream"):
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            for i, token in enumerate(sampled):
                chunk: dict[str, Any] = {
                    "id": "c",
                    "model": "m",
                    "choices": [{"index": 0, "delta": {"content": reply[i] if i < len(reply) else ""}}],
                }
                if with_ids:
                    chunk["choices"][0]["token_ids"] = [token]
                    if i == 0:
                        chunk["prompt_token_ids"] = prompt
                if body.get("logprobs"):
                    chunk["choices"][0]["logprobs"] = {"content": [entries[i]]}
                if i == len(sampled) - 1:
                    chunk["choices"][0]["finish_reason"] = "stop"
                await out.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await out.write(b"data: [DONE]\n\n")
            await out.write_eof()
            return out
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": reply},
            "finish_reason": "stop",
        }
        data: dict[str, Any] = {"id": "c", "object": "chat.completion", "choices": [choice]}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": entries}
        if with_ids:
            choice["token_ids"] = sampled
            data["prompt_token_ids"] = prompt
        return web.json_response(data)


@pytest.fixture
async def backend() -> AsyncIterator[tuple[Backend, str]]:
    scripted = Backend()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", scripted.chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield scripted, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def test_calls_keep_their_tokens_and_stitch_into_segments(backend: tuple[Backend, str]) -> None:
    scripted, url = backend
    first = [{"role": "user", "content": "hi"}]
    async with ModelProxy(Upstream(url, tokens=True)) as proxy:
        session = proxy.open_session("ep")
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {session.key}"}) as client:
            one = (await client.post(f"{proxy.base_url}/chat/completions", json={"messages": first})).json()
            second = [*first, {"role": "assistant", "content": "ok 1"}, {"role": "user", "content": "more"}]
            await client.post(f"{proxy.base_url}/chat/completions", json={"messages": second, "stream": True})
            compacted = [{"role": "user", "content": "summary"}]  # the harness rewrote its history
            await client.post(f"{proxy.base_url}/chat/completions", json={"messages": compacted})
        calls = proxy.close_session(session)
    assert all(body["logprobs"] is True and body["return_token_ids"] is True for body in scripted.bodies)
    assert one["choices"][0]["message"]["content"] == "ok 1"
    assert calls[0].prompt_ids == ids_of(first) and calls[0].token_ids == [*map(ord, "ok 1"), END]
    assert calls[0].logprobs == pytest.approx([-0.1 * (i + 1) for i in range(5)])
    assert calls[1].stream and calls[1].token_ids == [*map(ord, "ok 2"), END] and calls[1].prompt_ids == ids_of(second)
    turns = stitch_calls(calls)
    assert [turn.segment for turn in turns if turn] == [0, 0, 1]
    # the second call's prompt is the first call's context plus the template's glue and the new message
    context = calls[0].prompt_ids + calls[0].token_ids
    assert context + turns[1].prompt_ids == calls[1].prompt_ids and turns[1].prompt_ids[0] == 10
    assert turns[2].prompt_ids == ids_of(compacted) and turns[0].finish_reason == "stop"


async def test_without_tokens_nothing_is_asked_or_kept(backend: tuple[Backend, str]) -> None:
    scripted, url = backend
    async with ModelProxy(Upstream(url)) as proxy:
        session = proxy.open_session("ep")
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {session.key}"}) as client:
            await client.post(
                f"{proxy.base_url}/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
            )
        calls = proxy.close_session(session)
    assert "return_token_ids" not in scripted.bodies[0] and "logprobs" not in scripted.bodies[0]
    assert calls[0].token_ids == [] and stitch_calls(calls) == [None]

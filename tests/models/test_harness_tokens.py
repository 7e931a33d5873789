"""Harness mode token in, token out, end to end: the bundled harness runs in a local sandbox
and calls a vLLM-shaped backend through the recording proxy with the recipe's
``harness_tokens`` option on; the backend (a stand-in written from vLLM's documented
chat-completions fields: ``prompt_token_ids``, ``choices[].token_ids``,
``choices[].logprobs.content[].logprob``) renders each request with a character-level
template. Each call's step carries its ``TurnTokens`` (``stitch_calls``), the calls that
extend each other form one segment, and ``export tokens`` writes them with the sampler's
logprobs under mask 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import msgspec
from aiohttp import web

from orchard_async.models.client import ModelConfig
from orchard_async.recipes import claw
from orchard_async.recipes.claw.harness import HarnessPolicy
from orchard_async.records.export import export_tokens
from tests.recipes.swe_support import run_rollout
from tests.recipes.test_claw_openai import SCRIPT, text_reply

START, END, NEWLINE = 1, 2, 10


def shown(message: dict[str, Any]) -> str:
    """What the stand-in template shows of a message: its text, then each tool call."""
    calls = "".join(
        f"<call>{call['function']['name']}:{call['function']['arguments']}</call>"
        for call in message.get("tool_calls") or []
    )
    return (message.get("content") or "") + calls


def chars(text: str) -> list[int]:
    return [ord(c) + 3 for c in text]


def prompt_ids(messages: list[dict[str, Any]]) -> list[int]:
    ids: list[int] = []
    for message in messages:
        ids += [START, *chars(message["role"] + "\n" + shown(message)), END, NEWLINE]
    return [*ids, START, *chars("assistant\n")]


def test_harness_calls_carry_their_tokens_into_the_export(tmp_path: Path) -> None:
    bodies: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        bodies.append(body)
        reply = SCRIPT[len(bodies) - 1] if len(bodies) <= len(SCRIPT) else text_reply("done")
        data = json.loads(json.dumps(reply.body))
        choice = data["choices"][0]
        sampled = [*chars(shown(choice["message"])), END]
        if body.get("return_token_ids"):
            data["prompt_token_ids"] = prompt_ids(body["messages"])
            choice["token_ids"] = sampled
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": "t", "logprob": -0.01 * (i + 1)} for i in range(len(sampled))]}
        return web.json_response(data)

    async def main() -> Any:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        config = ModelConfig(model="scripted", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
        options = claw.ClawOptions.resolve({"harness_tokens": True})
        policy = HarnessPolicy.from_options(options, config, environ={})
        (task,) = claw.load_tasks("builtin:mail-reply-dana")
        try:
            return await run_rollout([task], policy, tmp_path / "run")
        finally:
            await policy.close()
            await runner.cleanup()

    result = anyio.run(main)
    (t,) = result.trajectories
    assert (t.status, t.reward, t.success) == ("finished", 1.0, True), (t.error, t.info, t.steps[-1:])
    assert len(bodies) == 4 and all(body["logprobs"] is True and body["return_token_ids"] for body in bodies)
    turns = [step.action.tokens for step in t.steps]
    assert turns[-1] is None  # the submit step: no model call
    calls = turns[:-1]
    assert all(turn is not None for turn in calls)
    assert [turn.segment for turn in calls] == [0, 0, 0, 0]  # every call extended the one before
    # the prefix invariant: each request's prompt is the context so far plus the call's added tokens
    context: list[int] = []
    for body, turn in zip(bodies, calls, strict=True):
        assert context + turn.prompt_ids == prompt_ids(body["messages"])
        context += turn.prompt_ids + turn.token_ids
    assert calls[1].prompt_ids[0] == NEWLINE and calls[0].finish_reason == "tool_calls"

    run_file = tmp_path / "run.jsonl"
    run_file.write_bytes(msgspec.json.encode(t) + b"\n")
    summary = export_tokens(run_file, tmp_path / "tokens.jsonl")
    assert summary.records == 1 and summary.skipped == 0
    (record,) = [json.loads(line) for line in (tmp_path / "tokens.jsonl").read_text().splitlines()]
    assert record["prompt_ids"] == prompt_ids(bodies[0]["messages"])
    assert record["prompt_ids"] + record["response_ids"] == context
    sampled = [i for i, mask in enumerate(record["response_mask"]) if mask]
    assert len(sampled) == sum(len(turn.token_ids) for turn in calls)
    assert [record["response_logprobs"][i] for i in sampled] == [lp for turn in calls for lp in turn.logprobs]
    assert record["reward"] == 1.0 and record["segments"] == 1


def test_without_the_option_no_tokens_are_asked() -> None:
    config = ModelConfig(model="m", base_url="http://127.0.0.1:9/v1")
    assert not HarnessPolicy.from_options(claw.ClawOptions.resolve({}), config, environ={}).upstream.tokens
    on = HarnessPolicy.from_env(
        {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "ORCHARD_MODEL": "m", "ORCHARD_CLAW_HARNESS_TOKENS": "1"}
    )
    assert on.upstream.tokens

"""Claw in harness mode on the local adapter: the bundled harness runs inside the sandbox and
calls a scripted chat server through the recording proxy (over a stream into the sandbox);
the trajectory holds one step per model call, the services' checks grade it, and the export
turns each call into one training sample."""

from __future__ import annotations

import json
import os
import uuid

import anyio
import msgspec
import pytest

import orchard_async as oa
from orchard_async.models.client import ModelConfig
from orchard_async.models.proxy import ModelCall
from orchard_async.recipes import claw
from orchard_async.recipes.claw.export import training_samples
from orchard_async.recipes.claw.harness import HarnessPolicy
from tests.conftest import require_docker
from tests.recipes.swe_support import run_rollout
from tests.recipes.test_claw_openai import SCRIPT, text_reply


def run(policy: HarnessPolicy, tmp_path, task_id: str = "mail-reply-dana"):
    (task,) = claw.load_tasks(f"builtin:{task_id}")

    async def main():
        try:
            return await run_rollout([task], policy, tmp_path)
        finally:
            await policy.close()

    return anyio.run(main)


def test_the_bundled_harness_solves_a_task_with_every_call_recorded(chat_server, tmp_path) -> None:
    server = chat_server(lambda request, index: SCRIPT[index] if index < len(SCRIPT) else text_reply("done"))
    config = ModelConfig(model="scripted", base_url=server.base_url, api_key="sk-upstream", max_retries=0)
    result = run(HarnessPolicy(config), tmp_path)
    (t,) = result.trajectories
    assert (t.status, t.reward, t.success) == ("finished", 1.0, True), (t.error, t.info, t.steps[-1:])
    assert len(server.requests) == 4 and len(t.steps) == 5  # one step per model call, then the submit
    # the upstream saw the real key; the sandbox only had its episode's key
    assert {r["headers"]["authorization"] for r in server.requests} == {"Bearer sk-upstream"}
    calls = [msgspec.json.decode(step.action.raw, type=ModelCall) for step in t.steps[:-1]]
    assert [call.index for call in calls] == [0, 1, 2, 3]
    assert [call.request["messages"] for call in calls] == [r["json"]["messages"] for r in server.requests]
    assert calls[0].request["messages"][1]["content"] == t.instruction  # the task's prompt, read from stdin
    assert calls[2].response["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "mail__send"
    assert t.steps[0].action.usage == {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}
    tools = {entry["function"]["name"] for entry in calls[0].request["tools"]}
    assert "mail__send" in tools and "agent__answer" not in tools
    summary = json.loads(t.steps[-1].action.raw)
    assert summary["exit_code"] == 0 and "answered" in summary["output"]
    assert t.info["tool_calls"] == 6  # the harness's calls reached the services' audit
    assert result.leaked == []

    samples = list(training_samples([t]))
    assert len(samples) == 4
    assert samples[3]["messages"] == server.requests[3]["json"]["messages"]
    assert samples[3]["response"] == {"role": "assistant", "content": "I replied to Dana: Thursday at 14:00 works."}
    assert {s["reward"] for s in samples} == {1.0} and [s["call_index"] for s in samples] == [0, 1, 2, 3]


def run_on_docker(task: claw.ClawTask, policy: HarnessPolicy) -> tuple[list[oa.Trajectory], list[str]]:
    """One episode of ``task`` on docker: its trajectories and the containers left behind."""
    from orchard_async.adapters.docker import DockerAdapter

    async def main() -> tuple[list[oa.Trajectory], list[str]]:
        adapter = DockerAdapter(run_id=f"t{uuid.uuid4().hex[:10]}")
        try:
            found = [t async for t in oa.rollout([task], policy, adapter, max_retries=0)]
        finally:
            await policy.close()
            leaked = await adapter.list_owned()
            await adapter.close()
        return found, leaked

    return anyio.run(main)


@pytest.mark.soak  # a container: `pytest -m soak`, CI runs both
def test_the_bundled_harness_solves_a_task_in_a_docker_container(chat_server) -> None:
    """The image's own python3 runs the harness and the harness_chat copied next to it."""
    image = os.environ.get("ORCHARD_CLAW_TEST_IMAGE", "orchard/python:test")
    require_docker(image)
    server = chat_server(lambda request, index: SCRIPT[index] if index < len(SCRIPT) else text_reply("done"))
    config = ModelConfig(model="scripted", base_url=server.base_url, max_retries=0)
    (task,) = claw.load_tasks("builtin:mail-reply-dana", image=image)
    (t,), leaked = run_on_docker(task, HarnessPolicy(config))
    summary = json.loads(t.steps[-1].action.raw)
    assert (t.status, t.reward, t.success) == ("finished", 1.0, True), (t.error, t.info, summary)
    assert summary["exit_code"] == 0 and "harness: answered after 4 turns" in summary["output"], summary
    assert len(server.requests) == 4 and len(t.steps) == 5 and t.info["tool_calls"] == 6
    assert leaked == []


def test_a_harness_that_gives_up_scores_zero_and_the_budget_holds(chat_server, tmp_path) -> None:
    listing = SCRIPT[0]  # lists the mail again and again, never acting
    server = chat_server(lambda request, index: listing)
    (task,) = claw.load_tasks("builtin:mail-reply-dana")
    config = ModelConfig(model="scripted", base_url=server.base_url, max_retries=0)
    result = run(HarnessPolicy(config), tmp_path)
    (t,) = result.trajectories
    assert (t.status, t.reward, t.success) == ("finished", 0.0, False), (t.error, t.info)
    assert len(server.requests) == task.max_steps - 1  # the proxy's budget: the harness ran out of calls
    assert len(t.steps) == task.max_steps
    assert json.loads(t.steps[-1].action.raw)["exit_code"] != 0


def as_chunks(reply_body: dict) -> list[dict]:
    """A scripted reply as the chat.completion.chunk events a streaming server sends."""
    message = reply_body["choices"][0]["message"]
    chunks: list[dict] = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    text = message.get("content") or ""
    chunks += [{"choices": [{"index": 0, "delta": {"content": text[i : i + 7]}}]} for i in range(0, len(text), 7)]
    for position, call in enumerate(message.get("tool_calls") or []):
        head = {"index": position, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"]}}
        arguments = call["function"]["arguments"]
        chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [head]}}]})
        for i in range(0, len(arguments), 9):
            piece = {"index": position, "function": {"arguments": arguments[i : i + 9]}}
            chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [piece]}}]})
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return chunks


def test_the_harness_streams_through_the_proxy(tmp_path) -> None:
    from aiohttp import web

    received: list[dict] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        received.append(body)
        reply = SCRIPT[len(received) - 1] if len(received) <= len(SCRIPT) else text_reply("done")
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for chunk in as_chunks(reply.body):
            await out.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    async def main():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        config = ModelConfig(model="scripted", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
        policy = HarnessPolicy(config, env={"CLAW_HARNESS_STREAM": "1"})
        (task,) = claw.load_tasks("builtin:mail-reply-dana")
        try:
            return await run_rollout([task], policy, tmp_path)
        finally:
            await policy.close()
            await runner.cleanup()

    result = anyio.run(main)
    (t,) = result.trajectories
    assert (t.status, t.reward, t.success) == ("finished", 1.0, True), (t.error, t.info, t.steps[-1:])
    assert all(body["stream"] is True for body in received) and len(received) == 4
    calls = [msgspec.json.decode(step.action.raw, type=ModelCall) for step in t.steps[:-1]]
    assert all(call.stream and call.chunks > 2 for call in calls)
    sent = calls[2].response["choices"][0]["message"]["tool_calls"][0]["function"]
    assert sent["name"] == "mail__send" and json.loads(sent["arguments"])["to"] == "dana@example.com"
    assert calls[3].response["choices"][0]["message"]["content"] == SCRIPT[3].body["choices"][0]["message"]["content"]


def test_harness_presets_by_name_or_a_command() -> None:
    from orchard_async.models.harness import HARNESS_CHAT
    from orchard_async.recipes.claw.harness import HARNESS_PATH, HARNESS_SOURCE, MINI_SWE_AGENT_COMMAND

    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "ORCHARD_MODEL": "m", "ORCHARD_CLAW_HARNESS": "mini-swe-agent"}
    mini = HarnessPolicy.from_env(env)
    assert mini.command == MINI_SWE_AGENT_COMMAND and mini.name == "harness:mini-swe-agent:m"
    assert [path.name for path in mini.files.values()] == ["mini_claw.yaml"]  # its Claw prompt, copied in
    other = HarnessPolicy.from_env({**env, "ORCHARD_CLAW_HARNESS": "my-agent --stdin"})
    assert (other.command, other.files, other.name) == ("my-agent --stdin", {}, "harness:my-agent:m")
    bundled = HarnessPolicy.from_env({k: v for k, v in env.items() if k != "ORCHARD_CLAW_HARNESS"})
    assert bundled.name == "harness:bundled:m" and bundled.command == f"python3 {HARNESS_PATH}"
    # the harness imports harness_chat from its own folder
    assert bundled.files == {HARNESS_PATH: HARNESS_SOURCE, "/tmp/claw/harness_chat.py": HARNESS_CHAT}
    assert HARNESS_SOURCE.name == "claw_harness.py" and all(path.is_file() for path in bundled.files.values())

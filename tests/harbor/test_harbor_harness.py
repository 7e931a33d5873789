"""The recipe's ``harness`` policy: a CLI agent inside the task's sandbox (the bundled terminal
harness, or mini-swe-agent), its model calls going through the recording proxy to a scripted
OpenAI-compatible server on loopback. It runs once per step of a multi-step task, each time
with that step's instruction, as the task's agent user in its workdir; every call it made is a
step of the trajectory, each step's reward is kept, and a model that fails is
``model_unavailable``, never a reward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from orchard_async.models.client import ModelConfig
from orchard_async.models.harness import HARNESS_CHAT
from orchard_async.models.proxy import ModelCall
from orchard_async.recipes import harbor
from orchard_async.recipes.harbor.harness import HOME, HarnessPolicy
from tests.harbor.support import load, ready, run
from tests.recipes.swe_support import Reply, ScriptedChatServer, chat_reply

# what the scripted model runs for an instruction (matched by a phrase of it)
TERMINAL_HARNESS = Path(harbor.__file__).parent / "sandbox" / "terminal_harness.py"
SOLUTIONS = {
    "Create `/app/list.txt`": "echo one > /app/list.txt",
    "Append the line `two`": "echo two >> /app/list.txt && cp seed.txt /app/seed-copy.txt",
    "Write the name of the user": "id -un > /app/whoami.txt && cat /app/whoami.txt",
}


def bash_call(command: str, index: int) -> Reply:
    call = {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
    message = {"role": "assistant", "content": "I run it.", "tool_calls": [call]}
    return Reply(
        body={
            "id": f"chatcmpl-{index}",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 200, "completion_tokens": 10, "total_tokens": 210},
        }
    )


def solver(request: dict[str, Any], index: int) -> Reply:
    """One command for the instruction, then a plain reply (the harness's end)."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        return chat_reply("Done.")
    instruction = messages[1]["content"]
    command = next(c for phrase, c in SOLUTIONS.items() if phrase in instruction)
    return bash_call(command, index)


def run_harness(tasks: list[Any], handler: Any, adapter: str, **harness: Any) -> tuple[dict[str, Any], Any]:
    server = ScriptedChatServer(handler).start()
    config = ModelConfig(model="scripted", base_url=server.base_url, api_key="sk-upstream", max_retries=0)
    policy = harbor.Stepwise(HarnessPolicy(config, **harness))

    async def episodes() -> dict[str, Any]:
        try:
            return await run(tasks, policy, adapter)
        finally:
            await policy.close()

    try:
        return anyio.run(episodes), server
    finally:
        server.stop()


def check_multi_step(t: Any, server: Any) -> None:
    assert (t.status, t.end_reason, t.reward) == ("finished", "submitted", 1.0), (t.error, t.info)
    assert t.info["steps"] == {"create": {"reward": 1.0}, "extend": {"reward": 1.0}}
    # the harness ran once per step, each run with its step's instruction only
    firsts = [r["json"]["messages"][1]["content"] for r in server.requests if len(r["json"]["messages"]) == 2]
    assert len(firsts) == 2 and "Create `/app/list.txt`" in firsts[0] and "Append the line" in firsts[1]
    assert "Append" not in firsts[0]
    # one step per model call, the step's end (its reward), the calls of the next step, the submit
    kinds = [(s.action.kind, s.action.command.split()[:2]) for s in t.steps]
    assert [k for k, _ in kinds] == ["exec"] * 5 + ["submit"], kinds
    boundary = json.loads(t.steps[2].action.raw)
    assert boundary["step"] == "create" and boundary["rewards"] == {"reward": 1.0} and boundary["next"] == "extend"
    calls = [msgspec.json.decode(t.steps[i].action.raw, type=ModelCall) for i in (0, 1, 3, 4)]
    assert [c.request["messages"] for c in calls] == [r["json"]["messages"] for r in server.requests]
    assert {r["headers"]["authorization"] for r in server.requests} == {"Bearer sk-upstream"}
    assert json.loads(t.steps[-1].action.raw)["exit_code"] == 0


def test_the_bundled_harness_runs_once_per_step_and_solves_a_multi_step_task() -> None:
    found, server = run_harness(load(ids=["multi-step"]), solver, "local")
    check_multi_step(found["multi-step"], server)


def test_a_harness_whose_model_fails_is_model_unavailable_never_a_reward() -> None:
    found, server = run_harness(load(ids=["hello-legacy"]), lambda request, index: Reply(status=503, body={}), "local")
    t = found["hello-legacy"]
    assert (t.status, t.end_reason, t.reward) == ("failed", "model_unavailable", 0.0), (t.status, t.end_reason, t.error)
    assert server.requests  # the harness did call


@pytest.mark.soak  # containers, two tasks: `pytest -m soak`, CI runs both (kubernetes in its cluster run)
@pytest.mark.parametrize("adapter", ["docker", "kubernetes"])
def test_the_bundled_harness_in_a_container_runs_as_the_agent_user_per_step(adapter) -> None:
    ready(adapter)
    found, server = run_harness(load(ids=["multi-step", "agent-user"]), solver, adapter)
    t = found["agent-user"]
    assert (t.reward, t.end_reason) == (1.0, "submitted"), (t.error, t.info)
    whoami = msgspec.json.decode(t.steps[1].action.raw, type=ModelCall).request["messages"][-1]["content"]
    assert whoami.strip().endswith("agent")  # the harness's command ran as the task's agent user
    multi = found["multi-step"]
    multi_requests = [r for r in server.requests if "list.txt" in json.dumps(r["json"]["messages"][1])]
    server.requests[:] = multi_requests
    check_multi_step(multi, server)


def test_harness_presets_by_name_or_a_command(monkeypatch) -> None:
    config = ModelConfig(model="m", base_url="http://127.0.0.1:9/v1")
    bundled = HarnessPolicy(config)
    assert bundled.name == "harness:bundled:m" and bundled.command == f"python3 {HOME}/harness.py"
    # the harness imports harness_chat from its own folder
    assert bundled.files == {f"{HOME}/harness.py": TERMINAL_HARNESS, f"{HOME}/harness_chat.py": HARNESS_CHAT}
    assert all(path.is_file() for path in bundled.files.values())
    mini = HarnessPolicy(config, harness="mini-swe-agent")
    assert mini.command.endswith('-t "$task"') and "exec mini" in mini.command and mini.files == {}
    own = HarnessPolicy(config, harness="my-agent --stdin")
    assert (own.command, own.files, own.name) == ("my-agent --stdin", {}, "harness:my-agent:m")
    monkeypatch.setenv("ORCHARD_MODEL", "m")
    policy = harbor.make_policy("harness", {"harness": "mini-swe-agent"})
    assert isinstance(policy, harbor.Stepwise) and policy.policy.name.startswith("harness:mini-swe-agent:")


def mini_solver(request: dict[str, Any], index: int) -> Reply:
    """mini-swe-agent's way: a bash call for the instruction, then its end command."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        return bash_call("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", index)
    instruction = json.dumps(messages)
    return bash_call(next(c for phrase, c in SOLUTIONS.items() if phrase in instruction), index)


@pytest.mark.soak  # mini imports litellm in the container: ~50 s on a loaded 2-core machine
def test_mini_swe_agent_solves_a_multi_step_task_on_docker() -> None:
    from orchard_async.recipes.claw.harness import MINI_SWE_AGENT_IMAGE
    from tests.conftest import require_docker

    require_docker(MINI_SWE_AGENT_IMAGE.tag)
    tasks = load(ids=["multi-step"], image_map={"ubuntu:24.04": MINI_SWE_AGENT_IMAGE.tag})
    found, server = run_harness(tasks, mini_solver, "docker", harness="mini-swe-agent")
    t = found["multi-step"]
    assert (t.reward, t.end_reason) == (1.0, "submitted"), (t.end_reason, t.error, t.info, t.steps[-1:])
    assert t.info["steps"] == {"create": {"reward": 1.0}, "extend": {"reward": 1.0}}
    assert len(server.requests) == 4 and len(t.steps) == 6  # two calls a step, the step's end, the submit
    calls = [msgspec.json.decode(t.steps[i].action.raw, type=ModelCall) for i in (0, 1, 3, 4)]
    assert {tool["function"]["name"] for tool in calls[0].request["tools"]} == {"bash"}  # mini's own tool
    assert "Create `/app/list.txt`" in json.dumps(calls[0].request["messages"])
    assert "Append the line" in json.dumps(calls[2].request["messages"])

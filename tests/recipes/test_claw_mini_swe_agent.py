"""A third-party harness in harness mode, on docker: mini-swe-agent (from PyPI, baked into
``orchard/claw-mini-swe-agent:bookworm`` by ``orchard-async images build``) runs inside a
container with network off, calls a scripted chat server through the recording proxy (litellm's
OpenAI provider, relayed over the sandbox's stream), drives the Claw services with bash
commands, and the episode is graded from the services' audit. Every call it made is in the
trajectory. Skips without docker or the image (fails in CI)."""

from __future__ import annotations

import json
import os
import time

import msgspec
import pytest

from orchard_async.models.client import ModelConfig
from orchard_async.models.proxy import ModelCall
from orchard_async.recipes import claw
from orchard_async.recipes.claw.harness import MINI_SWE_AGENT_IMAGE, HarnessPolicy
from tests.conftest import require_docker
from tests.recipes.swe_support import Reply
from tests.recipes.test_claw_harness import run_on_docker

try:
    from orchard_async.adapters.docker import DockerAdapter  # noqa: F401  (run_on_docker's; here to skip)
except ImportError as exc:  # aiodocker is an optional dependency
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"docker: {exc}; pip install 'orchard-async[docker]'", allow_module_level=True)

IMAGE = MINI_SWE_AGENT_IMAGE.tag
COMMANDS = [
    "mail list --unread",
    "mail read --id m2",
    'mail send --to dana@example.com --subject "Re: Moving our 1:1" --body "Thursday at 14:00 works for me."'
    " --in-reply-to m2",
    'claw answer "I replied to Dana: Thursday at 14:00 works."',
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
]


def bash_call(index: int, command: str) -> Reply:
    """A chat.completion calling mini-swe-agent's one tool, as an OpenAI server sends it."""
    call = {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
    message = {"role": "assistant", "content": f"Step {index + 1}.", "tool_calls": [call]}
    return Reply(
        body={
            "id": f"chatcmpl-{index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "scripted",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 300 + index, "completion_tokens": 20, "total_tokens": 320 + index},
        }
    )


@pytest.fixture(scope="module", autouse=True)
def docker_with_the_harness_image() -> None:
    require_docker(IMAGE)


@pytest.mark.soak  # long (a litellm import in a container: ~50 s on a loaded 2-core machine): `pytest -m soak`, CI runs both
def test_mini_swe_agent_solves_a_claw_task_with_every_call_recorded(chat_server) -> None:
    server = chat_server(lambda request, index: bash_call(index, COMMANDS[min(index, len(COMMANDS) - 1)]))
    config = ModelConfig(model="scripted", base_url=server.base_url, api_key="sk-upstream", max_retries=0)
    policy = HarnessPolicy(config, command="mini-swe-agent")
    (task,) = claw.load_tasks("builtin:mail-reply-dana", image=IMAGE)
    assert task.spec.network == "none"
    task.deadline = 900.0  # mini imports litellm: ~6 s of CPU, minutes on a loaded 2-core machine
    (t,), leaked = run_on_docker(task, policy)
    summary = json.loads(t.steps[-1].action.raw)
    assert (t.status, t.reward, t.success) == ("finished", 1.0, True), (t.error, t.info, summary)
    assert leaked == []
    assert summary["exit_code"] == 0, summary
    # every model call the harness made is a step, in order, as the server saw it
    assert len(server.requests) == len(COMMANDS) == len(t.steps) - 1
    calls = [msgspec.json.decode(step.action.raw, type=ModelCall) for step in t.steps[:-1]]
    assert [call.request["messages"] for call in calls] == [r["json"]["messages"] for r in server.requests]
    assert [call.status for call in calls] == [200] * len(COMMANDS)
    assert {tool["function"]["name"] for tool in calls[0].request["tools"]} == {"bash"}  # mini's own tool
    assert "Dana asked to move" in json.dumps(calls[0].request["messages"])  # the task reached it on stdin
    assert calls[4].usage == {"prompt_tokens": 304, "completion_tokens": 20, "total_tokens": 324}
    assert {r["headers"]["authorization"] for r in server.requests} == {"Bearer sk-upstream"}
    assert t.info["tool_calls"] == 4  # list, read, send, answer: the services' audit

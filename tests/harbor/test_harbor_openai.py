"""The recipe's ``openai`` policy: a terminal agent over an OpenAI-compatible server (a
scripted one here) solves a fixture task on the local adapter, its commands run as the task's
agent in its workdir, and a reply without one bash block is an invalid step it is told about."""

from __future__ import annotations

import anyio
import pytest

from orchard_async.models.client import ModelConfig
from orchard_async.recipes.harbor.openai_policy import TerminalAgent
from tests.harbor.support import load, run
from tests.recipes.swe_support import ScriptedChatServer, chat_reply

REPLIES = [
    "THOUGHT: I look around first, with no block.",
    "THOUGHT: Where am I?\n\n```bash\npwd\n```",
    "THOUGHT: Write it.\n\n```bash\nmkdir -p notes && pwd > notes/today.txt\n```",
    "THOUGHT: Done.\n\n```bash\nsubmit\n```",
]


@pytest.fixture
def server():
    running = ScriptedChatServer(lambda request, index: chat_reply(REPLIES[min(index, len(REPLIES) - 1)])).start()
    yield running
    running.stop()


def test_terminal_agent_solves_a_task_over_a_chat_server(server):
    agent = TerminalAgent(ModelConfig(model="scripted", base_url=server.base_url, max_retries=0))

    async def episode():
        try:
            return (await run(load(ids=["workdir"]), agent, "local"))["workdir"]
        finally:
            await agent.close()  # its HTTP client, in the loop that made it

    found = anyio.run(episode)
    assert found.reward == 1.0 and found.end_reason == "submitted", found.info
    assert [step.action.kind for step in found.steps] == ["invalid", "exec", "exec", "submit"]
    assert found.steps[1].observation.strip() == "/srv/work"  # the task's workdir, not the sandbox's
    first = server.requests[0]["json"]["messages"]
    assert first[0]["role"] == "system" and "notes/today.txt" in first[1]["content"]
    told = server.requests[1]["json"]["messages"]
    assert told[-2]["content"] == REPLIES[0] and "expected exactly one ```bash block" in told[-1]["content"]

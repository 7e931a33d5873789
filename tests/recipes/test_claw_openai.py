"""The Claw recipe's function-calling policy over real HTTP against a scripted chat server:
tool calls in, tool results back, several turns, the final answer recorded; a call of an
unknown tool or with arguments that fail the schema comes back as an error result."""

from __future__ import annotations

import json
from typing import Any

import anyio

from orchard_async.models.client import ModelConfig
from orchard_async.recipes import claw
from orchard_async.recipes.claw.openai_policy import ToolCallingPolicy
from tests.recipes.swe_support import Reply, run_rollout


def tool_reply(calls: list[tuple[str, dict[str, Any] | str]]) -> Reply:
    tool_calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
        }
        for i, (name, args) in enumerate(calls)
    ]
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return Reply(
        body={
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
        }
    )


def text_reply(text: str) -> Reply:
    message = {"role": "assistant", "content": text}
    return Reply(body={"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})


SCRIPT = [
    tool_reply([("mail__list", {"unread": True}), ("mail__teleport", {}), ("mail__read", {"idd": "m2"})]),
    tool_reply([("mail__read", {"id": "m2"}), ("mail__send", "{not json")]),
    tool_reply(
        [
            (
                "mail__send",
                {
                    "to": "dana@example.com",
                    "subject": "Re: Moving our 1:1",
                    "body": "Thursday at 14:00 works for me.",
                    "in_reply_to": "m2",
                },
            )
        ]
    ),
    text_reply("I replied to Dana: Thursday at 14:00 works."),
]


def test_function_calling_over_http_solves_a_task(chat_server, tmp_path) -> None:
    server = chat_server(lambda request, index: SCRIPT[index] if index < len(SCRIPT) else text_reply("done"))
    policy = ToolCallingPolicy(ModelConfig(model="scripted", base_url=server.base_url, max_retries=0))
    (task,) = claw.load_tasks("builtin:mail-reply-dana")

    async def main():
        try:
            return await run_rollout([task], policy, tmp_path)
        finally:
            await policy.close()

    run = anyio.run(main)
    (t,) = run.trajectories
    assert (t.status, t.reward, t.success) == ("finished", 1.0, True), (t.error, t.info)
    assert len(server.requests) == 4 and len(t.steps) == 5  # 3 tool turns, the answer, the submit
    first = server.requests[0]["json"]
    tools = {entry["function"]["name"]: entry["function"] for entry in first["tools"]}
    assert "mail__send" in tools and "agent__answer" not in tools
    assert tools["mail__send"]["parameters"]["required"] == ["to", "subject", "body"]
    # the second request carries one tool message per call, errors included
    results = {
        m["tool_call_id"]: json.loads(m["content"])
        for m in server.requests[1]["json"]["messages"]
        if m["role"] == "tool"
    }
    assert results["call_0"]["ok"] is True and {m["id"] for m in results["call_0"]["result"]} == {"m1", "m2"}
    assert results["call_1"]["status"] == 404 and "unknown tool" in results["call_1"]["error"]
    assert results["call_2"]["status"] == 400 and "missing required argument 'id'" in results["call_2"]["error"]
    second = {
        m["tool_call_id"]: json.loads(m["content"])
        for m in server.requests[2]["json"]["messages"]
        if m["role"] == "tool"
    }
    assert "not JSON" in second["call_1"]["error"]
    assert t.info["tool_calls"] == 6  # every call reached the audit, the bad ones too (the unparsable one did not)
    assert run.leaked == []

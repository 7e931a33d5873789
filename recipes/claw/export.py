"""Claw trajectories -> training data: the recipe's chat for ``orchard-async export``, and
harness-mode runs as one sample per recorded model call.

``orchard-async export sft|rl`` writes each episode in the chat its model had
(``training_chats``, ``claw_messages``), by the policy that played it:

* ``openai`` (function calling): the conversation ``openai_policy.build_messages`` gave the
  model, its system prompt, the task's prompt, each reply with its tool calls and each tool
  result;
* ``harness``: the last answered call's request messages and its response, as the harness
  sent them (a harness that keeps its whole history in each call: the whole episode; one
  that rewrites it: export its calls one by one with this module's ``main`` instead);
* scripted policies (``oracle``, ``empty``, ``noisy-oracle:P``), whose steps are shell
  commands: the recipe's shell-agent prompt (``sandbox/mini_claw.yaml``, the mini-swe-agent
  harness's), the task's instruction, each command as a reply in a ``bash`` block and its
  output, and ``submit`` at the end, as the SWE agent's chat shows its commands;
* the token policy (``--policy tokens``, ```bash replies): the same shell chat, with the
  model's own replies (an unreadable one too, followed by what it was told).

Every message has the same four fields in every record, ``role``, ``content`` (a string, or
null for a reply that only calls tools), ``tool_calls`` (null, or each call's ``id``,
``type`` and ``function`` with its ``name`` and its ``arguments`` as a JSON string) and
``tool_call_id`` (null but in ``tool`` messages): one type per field, so ``datasets`` loads
each record back unchanged.

The per-call samples (``main``, below): one sample per recorded model call.

Each step of a harness-mode episode (``harness.HarnessPolicy``) carries one ``ModelCall`` in
its ``action.raw``; each call that the model answered (HTTP status below 400, a message in
its response) becomes one JSON line::

    {"messages": [...],            # the request's messages, exactly as the harness sent them
     "tools": [...],               # the request's tools (absent when it sent none)
     "response": {"role": "assistant", "content": ..., "tool_calls": [...]},
     "reward": 1.0, "success": true,  # the episode's: every call of an episode shares it
     "usage": {...}, "latency_s": 0.41, "call_index": 0, "calls": 4,
     "episode_id": ..., "task_id": ..., "group_id": ..., "sample": 0, "run_id": ..., "policy": ...}

Only episodes that were scored are exported (``status == "finished"`` and a scored end
reason, as the SWE export); the others are counted by end reason.

    python -m orchard_async.recipes.claw.export TRAJECTORIES... --out samples.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import yaml

from orchard_async.models.proxy import ModelCall
from orchard_async.recipes.claw.openai_policy import build_messages
from orchard_async.recipes.claw.task import INSTRUCTION_TEMPLATE
from orchard_async.records import export as training_data
from orchard_async.records.trajectory import EndReason, Step, Trajectory, read_trajectories

_decode_call = msgspec.json.Decoder(ModelCall)

SHELL_AGENT_CONFIG = Path(__file__).parent / "sandbox" / "mini_claw.yaml"
OBSERVATION_CHARS = 10_000  # of a command's output in a scripted episode's chat
# The instruction's sentence after the task's prompt (and its attachments' line): where the prompt ends.
_AFTER_PROMPT = INSTRUCTION_TEMPLATE.split("{attachments}\n", 1)[1].split("(", 1)[0]
_ATTACHED = "\n\nAttached files (in your working directory): "


@functools.cache
def shell_system_prompt() -> str:
    """The recipe's shell agent's system prompt (the mini-swe-agent harness's, one file for both)."""
    return yaml.safe_load(SHELL_AGENT_CONFIG.read_text())["agent"]["system_template"].strip()


def message(role: str, content: Any = None, tool_calls: Any = None, tool_call_id: Any = None) -> dict[str, Any]:
    """A chat message with the four fields every Claw record's messages have, each of one type."""
    if isinstance(content, list):  # parts: this recipe's chats are text only
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    elif content is not None and not isinstance(content, str):
        content = json.dumps(content)
    calls = [
        {
            "id": str(call.get("id") or ""),
            "type": "function",
            "function": {
                "name": str((call.get("function") or {}).get("name", "")),
                "arguments": _arguments((call.get("function") or {}).get("arguments", "{}")),
            },
        }
        for call in tool_calls or []
        if isinstance(call, dict)
    ]
    return {
        "role": role,
        "content": content,
        "tool_calls": calls or None,
        "tool_call_id": None if tool_call_id is None else str(tool_call_id),
    }


def _arguments(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _uniform(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [message(m.get("role", ""), m.get("content"), m.get("tool_calls"), m.get("tool_call_id")) for m in messages]


def prompt_of(instruction: str) -> tuple[str, list[str]]:
    """(the task's prompt, its attachments), read back out of the instruction the task gave:
    what the function-calling policy put in its first user message."""
    head = instruction.split(_AFTER_PROMPT, 1)[0].rstrip("\n")
    prompt, _, attached = head.partition(_ATTACHED)
    return prompt, [name for name in attached.split(", ") if name]


def _calls_the_model_answered(trajectory: Trajectory) -> list[ModelCall]:
    return [call for call in recorded_calls(trajectory) if _response_message(call) is not None]


def _is_model_reply(step: Step) -> bool:
    """A step of the function-calling policy: its ``raw`` is the assistant message (or an
    invalid reply's text). A token policy's step (``action.tokens``) is not: that policy
    speaks the shell agent's ```bash protocol, so its episode stays in the shell chat even
    after an unreadable reply (a switch of chat would break its token prefix)."""
    if step.action.tokens is not None:
        return False
    if step.action.kind == "invalid":
        return bool(step.action.raw)
    try:
        reply = json.loads(step.action.raw)
    except (TypeError, ValueError):
        return False
    return isinstance(reply, dict) and reply.get("role") == "assistant"


def claw_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The chat of one Claw episode, by the policy that played it (see the module docstring)."""
    answered = _calls_the_model_answered(trajectory)
    if answered:
        last = answered[-1]
        return _uniform([*last.request.get("messages", []), _response_message(last) or {}])
    if any(_is_model_reply(step) for step in trajectory.steps):
        prompt, attachments = prompt_of(trajectory.instruction)
        seen = SimpleNamespace(
            task=SimpleNamespace(prompt=prompt, attachments=attachments),
            instruction=trajectory.instruction,
            history=trajectory.steps,
        )
        return _uniform(build_messages(seen))  # type: ignore[arg-type]
    return scripted_messages(trajectory)


def scripted_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    """A scripted episode (shell commands) in the shell agent's chat."""
    messages = [message("system", shell_system_prompt()), message("user", trajectory.instruction)]
    for step in trajectory.steps:
        sampled = step.action.tokens is not None and bool(step.action.raw)
        if sampled and step.action.kind == "invalid":
            # a token policy's unreadable reply: what the model wrote and what it was told
            messages.append(message("assistant", step.action.raw))
            messages.append(message("user", step.observation or f"error: {step.action.error}"))
        elif sampled and step.action.kind == "exec":
            messages.append(message("assistant", step.action.raw))  # the model's own words
            output = step.observation or f"(no output; exit status {step.exit_code})"
            messages.append(message("user", output[:OBSERVATION_CHARS]))
        elif step.action.kind == "submit":
            messages.append(message("assistant", "```bash\nsubmit\n```"))
        elif step.action.kind == "exec" and step.action.command:
            messages.append(message("assistant", f"```bash\n{step.action.command}\n```"))
            output = step.observation or f"(no output; exit status {step.exit_code})"
            messages.append(message("user", output[:OBSERVATION_CHARS]))
    return messages


def training_chats(options: dict[str, Any]) -> training_data.Chats:
    """The Claw chat for ``orchard-async export``."""
    return training_data.Chats(claw_messages)


def recorded_calls(trajectory: Trajectory) -> list[ModelCall]:
    """The model calls a harness-mode trajectory recorded, in order."""
    calls = []
    for step in trajectory.steps:
        if step.action.kind != "exec" or not step.action.raw.startswith("{"):
            continue
        try:
            calls.append(_decode_call.decode(step.action.raw))
        except msgspec.DecodeError:
            continue  # a step of another policy (its raw is a chat message, not a call)
    return calls


def _response_message(call: ModelCall) -> dict[str, Any] | None:
    choices = call.response.get("choices")
    if not (0 < call.status < 400) or not isinstance(choices, list) or not choices:
        return None
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        return None
    return {k: v for k, v in message.items() if k in ("role", "content", "tool_calls") and v is not None}


def training_samples(trajectories: Iterable[Trajectory], skipped: Counter[str] | None = None) -> Iterator[dict]:
    for trajectory in trajectories:
        if trajectory.status != "finished" or not EndReason(trajectory.end_reason).scored:
            if skipped is not None:
                skipped[trajectory.end_reason] += 1
            continue
        calls = recorded_calls(trajectory)
        for call in calls:
            response = _response_message(call)
            if response is None:
                if skipped is not None:
                    skipped["failed_call"] += 1
                continue
            sample: dict[str, Any] = {"messages": call.request.get("messages", [])}
            if call.request.get("tools"):
                sample["tools"] = call.request["tools"]
            sample.update(
                response=response,
                reward=trajectory.reward,
                success=trajectory.success,
                usage=call.usage,
                latency_s=round(call.latency_s, 4),
                call_index=call.index,
                calls=len(calls),
                episode_id=trajectory.episode_id,
                task_id=trajectory.task_id,
                group_id=trajectory.group_id,
                sample=trajectory.sample,
                run_id=trajectory.run_id,
                policy=trajectory.policy,
            )
            yield sample


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchard_async.recipes.claw.export", description=__doc__.split("\n")[0]
    )
    parser.add_argument("trajectories", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    skipped: Counter[str] = Counter()
    written = 0
    with open(args.out, "w", encoding="utf-8") as out:
        for path in args.trajectories:
            for sample in training_samples(read_trajectories(path), skipped):
                out.write(json.dumps(sample, ensure_ascii=False) + "\n")
                written += 1
    print(json.dumps({"samples": written, "skipped": dict(skipped)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

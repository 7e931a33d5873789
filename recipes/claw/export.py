"""Harness-mode trajectories -> training samples: one sample per recorded model call.

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
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from orchard_async.models.proxy import ModelCall
from orchard_async.records.trajectory import EndReason, Trajectory, read_trajectories

_decode_call = msgspec.json.Decoder(ModelCall)


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

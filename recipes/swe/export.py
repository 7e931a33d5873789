"""Trajectories -> training data: chat-format JSONL for SFT, reward groups for GRPO.

SFT, one line per finished episode::

    {"messages": [{"role": "system", ...}, {"role": "user", ...}, {"role": "assistant", ...}, ...],
     "resolved": true, "reward": 1.0, "instance_id": ..., "episode_id": ..., "policy": ...,
     "end_reason": "submitted", "turns": 3, "usage": {"prompt_tokens": ..., ...}, "patch": "diff --git ..."}

GRPO, one line per group (the ``group_size`` samples of one task)::

    {"group_id": "minicalc__1/g0", "instance_id": "minicalc__1",
     "prompt": [system, user],
     "samples": [{"episode_id": ..., "completion": [assistant, user, ..., assistant],
                  "reward": 1.0, "resolved": true, "advantage": 0.87, ...}, ...],
     "stats": {"size": 4, "mean": 0.5, "std": 0.5, "min": 0.0, "max": 1.0,
               "resolved": 2, "resolved_rate": 0.5, "degenerate": false}}

``advantage`` is the group-normalised reward ``(r - mean) / (std + 1e-6)`` (GRPO);
``degenerate`` groups (every sample the same reward) carry no learning signal and can be
dropped with ``skip_degenerate``. The messages are built by the same function the agent
uses to talk to the model, so they are exactly what the model saw. Episodes that failed
for reasons outside the policy (infrastructure, a task's own error) are skipped and
counted; an episode the policy itself broke (``policy_error``) stays in, rewarded 0.

Run as ``python -m orchard_async.recipes.swe.export {sft,grpo} TRAJECTORIES --out FILE``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from orchard_async import ConfigError, Trajectory, read_trajectories

from .agent import OBSERVATION_CHARS, SYSTEM_PROMPT, build_messages

EPSILON = 1e-6


class ExportSummary(msgspec.Struct, kw_only=True):
    path: str
    records: int  # lines written: episodes (sft) or groups (grpo)
    episodes: int  # episodes in the written records
    skipped: int  # episodes left out (failed outside the policy, filtered)
    mean_reward: float
    resolved_rate: float
    groups_degenerate: int = 0


def _usable(trajectory: Trajectory) -> bool:
    return trajectory.status == "finished" or trajectory.end_reason == "policy_error"


def _usage(trajectory: Trajectory) -> dict[str, int]:
    total: dict[str, int] = defaultdict(int)
    for step in trajectory.steps:
        for key, value in step.action.usage.items():
            total[key] += value
    return dict(total)


def trajectory_messages(
    trajectory: Trajectory, *, system_prompt: str = SYSTEM_PROMPT, observation_chars: int = OBSERVATION_CHARS
) -> list[dict[str, Any]]:
    return build_messages(
        trajectory.instruction, trajectory.steps, system_prompt=system_prompt, observation_chars=observation_chars
    )


def sft_record(trajectory: Trajectory, **prompt_options: Any) -> dict[str, Any]:
    return {
        "messages": trajectory_messages(trajectory, **prompt_options),
        "resolved": bool(trajectory.success),
        "reward": trajectory.reward,
        "instance_id": trajectory.task_id,
        "episode_id": trajectory.episode_id,
        "group_id": trajectory.group_id,
        "policy": trajectory.policy,
        "end_reason": trajectory.end_reason,
        "turns": len(trajectory.steps),
        "usage": _usage(trajectory),
        "patch": trajectory.info.get("patch", ""),
    }


def group_stats(rewards: list[float], resolved: list[bool]) -> dict[str, Any]:
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return {
        "size": n,
        "mean": mean,
        "std": std,
        "min": min(rewards),
        "max": max(rewards),
        "resolved": sum(resolved),
        "resolved_rate": sum(resolved) / n,
        "degenerate": max(rewards) - min(rewards) < EPSILON,
    }


def grpo_groups(
    trajectories: Iterable[Trajectory], *, min_group_size: int = 1, **prompt_options: Any
) -> tuple[list[dict[str, Any]], int]:
    """Group records (in first-seen order) and the number of episodes left out."""
    groups: dict[str, list[Trajectory]] = {}
    skipped = 0
    for trajectory in trajectories:
        if not _usable(trajectory):
            skipped += 1
            continue
        groups.setdefault(trajectory.group_id, []).append(trajectory)
    records = []
    for group_id, members in groups.items():
        if len(members) < min_group_size:
            skipped += len(members)
            continue
        members.sort(key=lambda t: t.sample)
        stats = group_stats([t.reward for t in members], [t.success for t in members])
        prompt = trajectory_messages(members[0], **prompt_options)[:2]
        samples = []
        for t in members:
            messages = trajectory_messages(t, **prompt_options)
            samples.append(
                {
                    "episode_id": t.episode_id,
                    "sample": t.sample,
                    "completion": messages[2:],
                    "reward": t.reward,
                    "resolved": bool(t.success),
                    "advantage": (t.reward - stats["mean"]) / (stats["std"] + EPSILON),
                    "end_reason": t.end_reason,
                    "usage": _usage(t),
                }
            )
        records.append({"group_id": group_id, "instance_id": members[0].task_id, "prompt": prompt, "samples": samples, "stats": stats})
    return records, skipped


def _load(source: Iterable[Trajectory] | str | Path) -> list[Trajectory]:
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.exists():
            raise ConfigError(f"{path}: no such trajectory file")
        return list(read_trajectories(path))
    return list(source)


def _write(out: str | Path, records: list[dict[str, Any]]) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def export_sft(
    source: Iterable[Trajectory] | str | Path, out: str | Path, *, only_resolved: bool = False, **prompt_options: Any
) -> ExportSummary:
    """One chat record per usable episode (``only_resolved``: just the successful ones)."""
    trajectories = _load(source)
    chosen = [t for t in trajectories if _usable(t) and (t.success or not only_resolved)]
    records = [sft_record(t, **prompt_options) for t in chosen]
    path = _write(out, records)
    rewards = [t.reward for t in chosen]
    return ExportSummary(
        path=str(path),
        records=len(records),
        episodes=len(records),
        skipped=len(trajectories) - len(chosen),
        mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
        resolved_rate=sum(t.success for t in chosen) / len(chosen) if chosen else 0.0,
    )


def export_grpo(
    source: Iterable[Trajectory] | str | Path,
    out: str | Path,
    *,
    min_group_size: int = 1,
    skip_degenerate: bool = False,
    **prompt_options: Any,
) -> ExportSummary:
    """One record per group with per-group reward statistics and advantages."""
    trajectories = _load(source)
    records, skipped = grpo_groups(trajectories, min_group_size=min_group_size, **prompt_options)
    degenerate = sum(r["stats"]["degenerate"] for r in records)
    if skip_degenerate:
        skipped += sum(r["stats"]["size"] for r in records if r["stats"]["degenerate"])
        records = [r for r in records if not r["stats"]["degenerate"]]
    path = _write(out, records)
    samples = [s for r in records for s in r["samples"]]
    return ExportSummary(
        path=str(path),
        records=len(records),
        episodes=len(samples),
        skipped=skipped,
        mean_reward=sum(s["reward"] for s in samples) / len(samples) if samples else 0.0,
        resolved_rate=sum(s["resolved"] for s in samples) / len(samples) if samples else 0.0,
        groups_degenerate=degenerate,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=["sft", "grpo"], help="sft: one chat per episode; grpo: one record per group")
    parser.add_argument("trajectories", help="trajectory file written by `orchard-async run` (.jsonl or .msgpack)")
    parser.add_argument("--out", required=True, help="output JSONL file")
    parser.add_argument("--only-resolved", action="store_true", help="sft: keep only resolved episodes")
    parser.add_argument("--min-group-size", type=int, default=1, help="grpo: drop groups with fewer samples")
    parser.add_argument("--skip-degenerate", action="store_true", help="grpo: drop groups whose rewards are all equal")


def run_export(args: argparse.Namespace) -> ExportSummary:
    if args.format == "sft":
        return export_sft(args.trajectories, args.out, only_resolved=args.only_resolved)
    return export_grpo(args.trajectories, args.out, min_group_size=args.min_group_size, skip_degenerate=args.skip_degenerate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchard_async.recipes.swe.export", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        summary = run_export(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(msgspec.to_builtins(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

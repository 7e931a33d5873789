"""Trajectories -> training data: chat-format JSONL for SFT, one record per sample for RL.

Only episodes the scorer judged are training data: ``status == "finished"`` with a scored
end reason (``EndReason.scored``: ``submitted``, ``max_steps``, ``deadline``,
``context_exhausted`` or ``parse_failures``; the last is RL data only, never SFT). Everything else is left out and counted by reason: the
infrastructure's failures (``verifier_error``, ``model_unavailable``, ``sandbox_lost``,
``create_failed``, ``infra_error``), a task's own bug (``task_error``) and a policy that
raised (``policy_error``: a crash of the policy's code, or a request the model server
rejected, says nothing about the model's skill, and scoring never ran, so its reward 0
would be invented). ``orchard_async.EndReason`` documents every reason.

SFT (``sft``), one line per episode whose reward clears the bar (default: resolved only;
``min_reward=x`` keeps ``reward >= x``), ending on the model's last reply::

    {"messages": [{"role": "system", ...}, {"role": "user", ...}, {"role": "assistant", ...}, ...],
     "resolved": true, "reward": 1.0, "instance_id": ..., "episode_id": ..., "group_id": "<run>/<task>/g0",
     "run_id": ..., "policy": ..., "end_reason": "submitted", "turns": 3, "usage": {...}, "patch": "diff --git ..."}

RL (``rl``; ``grpo`` is the same), one line per sample::

    {"prompt": [system, user],                                   # the messages before the first model turn
     "messages": [{"role": ..., "content": ..., "train": bool}, ...],   # train: the model's turns only
     "reward": 1.0, "advantage": 0.5, "group_id": "<run>/<task>/g0",
     "group": {"size": 2, "dropped": 0, "mean": 0.5, "std": 0.5, "resolved": 1, "degenerate": false},
     "resolved": true, "instance_id": ..., "episode_id": ..., "sample": 0, "run_id": ..., ...}

``advantage`` is ``reward - mean`` over the group's exported samples (``advantage="std"``:
divided by ``std + 1e-6``, population std, as GRPO does); it sums to 0 over each group. A
group some of whose samples were dropped (infrastructure) keeps its judged samples, with
the mean over those alone and ``group.dropped`` saying how many are missing;
``complete_groups_only`` drops such groups instead. Groups are keyed by run: ``group_id`` is
prefixed with the run id, and inputs from different runs are refused unless
``allow_mixed_runs``. See docs/training-formats.md for feeding these to TRL and verl.

The machinery (which episodes are data, groups, advantages, the files) is every recipe's:
``orchard_async.records.export``. This module gives it the SWE agent's chat and the SFT ``patch``
(``training_chats``).

Run as ``orchard-async export {sft,rl} TRAJECTORIES... --out FILE`` (any recipe's runs), or
``python -m orchard_async.recipes.swe.export`` (SWE runs only: another recipe's are refused).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from orchard_async import ConfigError, Trajectory
from orchard_async.recipes.swe.agent import OBSERVATION_CHARS, SYSTEM_PROMPT, build_messages
from orchard_async.records import export as training_data

FORMATS = training_data.FORMATS
ExportSummary = training_data.ExportSummary
Sample = training_data.Sample
Source = training_data.Source
add_arguments = training_data.add_arguments


def swe_messages(
    trajectory: Trajectory, *, system_prompt: str = SYSTEM_PROMPT, observation_chars: int = OBSERVATION_CHARS
) -> list[dict[str, Any]]:
    """The conversation exactly as the SWE agent's model saw it, plus its last reply."""
    return build_messages(
        trajectory.instruction, trajectory.steps, system_prompt=system_prompt, observation_chars=observation_chars
    )


def with_patch(record: dict[str, Any], trajectory: Trajectory) -> dict[str, Any]:
    """An SFT record carries the patch the episode submitted (what the chat produced)."""
    record["patch"] = trajectory.info.get("patch", "")
    return record


def training_chats(options: dict[str, Any]) -> training_data.Chats:
    """The SWE agent's chat for ``orchard-async export``; SFT records also carry the patch."""
    return training_data.Chats(swe_messages, with_patch if options.get("format") == "sft" else None)


def sft_record(trajectory: Trajectory | Sample) -> dict[str, Any] | None:
    """One episode's SFT record (None when the model never replied)."""
    record = training_data.sft_record(trajectory, swe_messages)
    plain = trajectory.trajectory if isinstance(trajectory, Sample) else trajectory
    return None if record is None else with_patch(record, plain)


def sft_records(trajectories: Iterable[Trajectory | Sample], **bar: Any) -> list[dict[str, Any]]:
    """The SFT records of the scored episodes that clear the bar (``min_reward``,
    ``only_resolved``; ``skipped`` counts the rest by reason)."""
    samples = [item if isinstance(item, Sample) else Sample(item.run_id, item) for item in trajectories]
    by_key = {(sample.run, sample.trajectory.episode_id): sample.trajectory for sample in samples}
    records = training_data.sft_records(samples, swe_messages, **bar)
    return [with_patch(record, by_key[(record["run_id"], record["episode_id"])]) for record in records]


def export_sft(
    sources: Source | Sequence[Source],
    out: str | Path,
    *,
    min_reward: float | None = None,
    only_resolved: bool = False,
    allow_mixed_runs: bool = False,
) -> ExportSummary:
    """One chat record per scored episode whose reward clears the bar (default: resolved)."""
    return training_data.export(
        "sft",
        sources,
        out,
        swe_messages,
        finish=with_patch,
        min_reward=min_reward,
        only_resolved=only_resolved,
        allow_mixed_runs=allow_mixed_runs,
    )


def export_rl(
    sources: Source | Sequence[Source],
    out: str | Path,
    *,
    advantage: training_data.Advantage = "mean",
    min_group_size: int = 1,
    skip_degenerate: bool = False,
    complete_groups_only: bool = False,
    allow_mixed_runs: bool = False,
) -> ExportSummary:
    """One record per scored sample, with its group id, training mask and group advantage."""
    return training_data.export(
        "rl",
        sources,
        out,
        swe_messages,
        advantage=advantage,
        min_group_size=min_group_size,
        skip_degenerate=skip_degenerate,
        complete_groups_only=complete_groups_only,
        allow_mixed_runs=allow_mixed_runs,
    )


export_grpo = export_rl  # the format's former name


def run_export(args: argparse.Namespace) -> ExportSummary:
    sources = [args.trajectories, *getattr(args, "more_trajectories", [])]
    if args.format == "sft":
        return export_sft(
            sources,
            args.out,
            min_reward=args.min_reward,
            only_resolved=args.only_resolved,
            allow_mixed_runs=args.allow_mixed_runs,
        )
    return export_rl(
        sources,
        args.out,
        advantage=args.advantage,
        min_group_size=args.min_group_size,
        skip_degenerate=args.skip_degenerate,
        complete_groups_only=args.complete_groups_only,
        allow_mixed_runs=args.allow_mixed_runs,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchard_async.recipes.swe.export", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        given = [Path(path) for path in [args.trajectories, *args.more_trajectories]]
        training_data.refuse_other_recipes([path for path in given if path.is_file()], "swe", "this SWE exporter")
        summary = run_export(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(msgspec.to_builtins(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

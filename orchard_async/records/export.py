"""Trajectories -> training data, for every recipe: SFT chats and RL groups.

The rules are the same whatever the recipe (docs/training-formats.md); a recipe gives only
its chat builder (``messages_of``: a trajectory -> the conversation exactly as its model saw
it, plus the model's last reply) and, optionally, a last touch to each record
(``finish``: SWE adds the patch to SFT records, the GUI export lists its images), as a
``Chats`` from its module's ``training_chats(options)``. ``orchard-async export`` (this
module's ``add_command``) reads the recipe from each input's run header and uses that
recipe's chats, never another's: inputs of different recipes are refused by name.

Every record of one export has the same fields with the same types (a message's
``content`` is a string in every recipe's chat; images and tool calls have fields of their
own), so ``datasets.load_dataset("json", ...)`` loads each record back unchanged.

Only episodes the scorer judged are training data: ``status == "finished"`` with a scored
end reason (``EndReason.scored``). Everything else is left out and counted by reason in
``skipped_reasons``: the infrastructure's failures, a task's own bug (``task_error``) and a
policy that raised (``policy_error``). ``parse_failures`` is RL data only, never SFT (its
chat ends in replies that are not actions).

``sft``: one chat per scored episode whose reward clears the bar (default: resolved).
``rl`` (``grpo`` is the same): one record per scored sample with its training mask and its
advantage within its group (``reward - mean``; ``advantage="std"`` divides by the group's
std + 1e-6, as GRPO does). Group ids are prefixed with the run id, and inputs from
different runs are refused unless ``allow_mixed_runs``. ``recipes/swe/export.py`` documents
the records' fields.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from orchard_async.errors import ConfigError
from orchard_async.records.trajectory import EndReason, Trajectory, read_run_header, read_trajectories

MessagesOf = Callable[[Trajectory], list[dict[str, Any]]]
Finish = Callable[[dict[str, Any], Trajectory], dict[str, Any]]


@dataclass(frozen=True)
class Chats:
    """What a recipe gives the export: its chat builder and, optionally, a last touch to each
    record. A recipe module returns one from ``training_chats(options)`` (``options``: the
    export command's arguments by name, its own among them: see ``add_export_arguments``)."""

    messages_of: MessagesOf
    finish: Finish | None = None


EPSILON = 1e-6
# The episodes the scorer judged on what the agent did: the only ones that are data.
SCORED_END_REASONS = frozenset(reason for reason in EndReason if reason.scored)
FORMATS = ("sft", "rl", "grpo")
TOKENS = "tokens"  # the token export (token_records): ids, not chats; any recipe's token-policy runs

Source = Iterable[Trajectory] | str | Path


class ExportSummary(msgspec.Struct, kw_only=True):
    path: str
    records: int  # lines written (one per episode in both formats)
    episodes: int  # episodes in the written records
    skipped: int  # input episodes left out, for the reasons in skipped_reasons
    mean_reward: float  # over the written episodes
    resolved_rate: float
    groups: int = 0  # rl: groups written
    groups_degenerate: int = 0  # rl: written groups whose samples all have the same reward
    groups_partial: int = 0  # rl: written groups missing samples dropped as unjudged
    runs: list[str] = []
    skipped_reasons: dict[str, int] = {}


def is_scored(trajectory: Trajectory) -> bool:
    """Whether the episode ended in a way its reward means something."""
    return trajectory.status == "finished" and trajectory.end_reason in SCORED_END_REASONS


def unscored_reason(trajectory: Trajectory) -> str:
    if trajectory.status != "finished":
        return trajectory.end_reason or trajectory.status
    return f"unscored_{trajectory.end_reason}"  # finished, but an end the scorer does not vouch for


# -- inputs: one run unless asked ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    """A trajectory and the run it belongs to (groups never span runs)."""

    run: str
    trajectory: Trajectory


def _header_run_id(path: Path) -> str | None:
    """The run id a file's run header names, where the file has one that does (the run
    header is newer than some trajectory files)."""
    header = read_run_header(path) or {}
    run_id = header.get("run_id")
    return run_id if isinstance(run_id, str) and run_id else None


def _read(path: Path) -> list[Trajectory]:
    if not path.exists():
        raise ConfigError(f"{path}: no such trajectory file")
    if not path.is_file():
        raise ConfigError(f"{path}: not a file; give the trajectory file written by `orchard-async run`")
    return list(read_trajectories(path))


def _source_runs(
    trajectories: list[Trajectory], allow_mixed_runs: bool, name: str, header_run_id: str | None = None
) -> list[Sample]:
    """Each trajectory of one input with its run.

    A file written by one ``orchard-async run`` and continued with ``--resume`` may hold
    several ``run_id`` values (an invocation draws one unless the run header fixes it) but
    never the same episode twice with a result: it is one run, named by its header's run id
    or else its first ``run_id``, and its groups stay whole. A file that holds an episode
    twice is several runs concatenated."""
    run_ids = list(dict.fromkeys(t.run_id for t in trajectories))
    judged = Counter(t.episode_id for t in trajectories if is_scored(t))
    repeated = [episode for episode, count in judged.items() if count > 1]
    if not repeated or len(run_ids) <= 1:  # one run (the same episode twice in one run: see load_samples)
        run = header_run_id or (run_ids[0] if run_ids else "")
        return [Sample(run, t) for t in trajectories]
    if not allow_mixed_runs:
        raise ConfigError(
            f"{name} holds {len(run_ids)} runs ({', '.join(run_ids[:4])}) concatenated (episode {repeated[0]} "
            "is in it twice); export each run on its own, or pass --allow-mixed-runs to keep their groups apart"
        )
    return [Sample(t.run_id, t) for t in trajectories]


def as_sources(sources: Source | Sequence[Source]) -> list[Source]:
    """One path, several paths, or trajectories in memory -> a list of inputs."""
    if isinstance(sources, str | Path):
        return [sources]
    items = list(sources)  # type: ignore[arg-type]
    if items and all(isinstance(item, str | Path) for item in items):
        return items
    return [items]  # trajectories in memory: one input


def load_samples(sources: Source | Sequence[Source], *, allow_mixed_runs: bool = False) -> list[Sample]:
    """The trajectories of every input with their runs. Trajectories of different runs are an
    error unless ``allow_mixed_runs`` (their groups are then kept apart by run id); the same
    episode of the same run twice is always an error (a file given twice)."""
    return samples_of(as_sources(sources), allow_mixed_runs)


def samples_of(inputs: list[Source], allow_mixed_runs: bool) -> list[Sample]:
    samples: list[Sample] = []
    for source in inputs:
        if isinstance(source, str | Path):
            path = Path(source)
            samples += _source_runs(_read(path), allow_mixed_runs, str(path), _header_run_id(path))
        else:
            samples += _source_runs(list(source), allow_mixed_runs, "the trajectories")
    runs = list(dict.fromkeys(sample.run for sample in samples))
    if len(runs) > 1 and not allow_mixed_runs:
        raise ConfigError(
            f"the inputs hold {len(runs)} different runs ({', '.join(runs[:4])}); export each run on its own, "
            "or pass --allow-mixed-runs to export them together (their groups stay apart, prefixed by run id)"
        )
    seen: Counter[tuple[str, str]] = Counter(
        (sample.run, sample.trajectory.episode_id) for sample in samples if is_scored(sample.trajectory)
    )
    twice = [key for key, count in seen.items() if count > 1]
    if twice:
        run, episode = twice[0]
        raise ConfigError(f"episode {episode} of run {run} is in the inputs twice; give each trajectory file once")
    return samples


def run_group_id(sample: Sample) -> str:
    """The group id, unique across runs: the run id, then the rollout's group id."""
    return f"{sample.run}/{sample.trajectory.group_id}" if sample.run else sample.trajectory.group_id


# -- records --------------------------------------------------------------------------------


# The token counts (and the model requests retried) every record carries, each always present
# (0: none reported): a dict whose keys varied from record to record would not load back
# unchanged as one column.
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "retries")


def _usage(trajectory: Trajectory) -> dict[str, int]:
    total: dict[str, int] = dict.fromkeys(USAGE_KEYS, 0)
    for step in trajectory.steps:
        for key in USAGE_KEYS:
            total[key] += int(step.action.usage.get(key, 0))
    return total


def _identity(sample: Sample) -> dict[str, Any]:
    trajectory = sample.trajectory
    return {
        "resolved": bool(trajectory.success),
        "instance_id": trajectory.task_id,
        "episode_id": trajectory.episode_id,
        "group_id": run_group_id(sample),
        "sample": trajectory.sample,
        "run_id": sample.run,
        "policy": trajectory.policy,
        "end_reason": trajectory.end_reason,
        "turns": len(trajectory.steps),
        "usage": _usage(trajectory),
    }


def sft_record(trajectory: Trajectory | Sample, messages_of: MessagesOf) -> dict[str, Any] | None:
    """The chat of one episode, cut after the model's last reply (an observation after it
    teaches nothing); None when the model never replied."""
    sample = trajectory if isinstance(trajectory, Sample) else Sample(trajectory.run_id, trajectory)
    messages = messages_of(sample.trajectory)
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()
    if not messages:
        return None
    return {
        "messages": messages,
        "reward": sample.trajectory.reward,
        **_identity(sample),
    }


def sft_records(
    trajectories: Iterable[Trajectory | Sample],
    messages_of: MessagesOf,
    *,
    min_reward: float | None = None,
    only_resolved: bool = False,
    skipped: Counter[str] | None = None,
) -> list[dict[str, Any]]:
    """SFT records of the scored episodes that clear the bar: ``reward >= min_reward``, or
    resolved when no ``min_reward`` is given (and with ``only_resolved``)."""
    skipped = Counter() if skipped is None else skipped
    records = []
    for item in trajectories:
        trajectory = item.trajectory if isinstance(item, Sample) else item
        if not is_scored(trajectory):
            skipped[unscored_reason(trajectory)] += 1
        elif trajectory.end_reason == EndReason.PARSE_FAILURES:  # its chat ends in replies that are not actions
            skipped[EndReason.PARSE_FAILURES] += 1
        elif (min_reward is None or only_resolved) and not trajectory.success:
            skipped["unresolved"] += 1
        elif min_reward is not None and not trajectory.reward >= min_reward:
            skipped["below_min_reward"] += 1
        elif (record := sft_record(item, messages_of)) is None:
            skipped["no_assistant_turn"] += 1
        else:
            records.append(record)
    return records


def group_stats(rewards: list[float], resolved: list[bool], dropped: int = 0) -> dict[str, Any]:
    """Population statistics of a group's exported rewards."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return {
        "size": n,
        "dropped": dropped,
        "mean": mean,
        "std": std,
        "min": min(rewards),
        "max": max(rewards),
        "resolved": sum(resolved),
        "degenerate": max(rewards) - min(rewards) < EPSILON,
    }


Advantage = Literal["mean", "std"]


def advantage_of(reward: float, stats: dict[str, Any], advantage: Advantage = "mean") -> float:
    centred = reward - stats["mean"]
    return centred / (stats["std"] + EPSILON) if advantage == "std" else centred


def rl_record(
    sample: Sample, stats: dict[str, Any], messages_of: MessagesOf, advantage: Advantage = "mean"
) -> dict[str, Any]:
    messages = messages_of(sample.trajectory)
    first_reply = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    return {
        "prompt": messages[:first_reply],
        "messages": [{**message, "train": message["role"] == "assistant"} for message in messages],
        "reward": sample.trajectory.reward,
        "advantage": advantage_of(sample.trajectory.reward, stats, advantage),
        "group": stats,
        **_identity(sample),
    }


class RLGroups(msgspec.Struct, kw_only=True):
    records: list[dict[str, Any]]
    groups: int
    degenerate: int
    partial: int
    skipped: Counter[str]


def rl_records(
    samples: Iterable[Sample | Trajectory],
    messages_of: MessagesOf,
    *,
    advantage: Advantage = "mean",
    min_group_size: int = 1,
    skip_degenerate: bool = False,
    complete_groups_only: bool = False,
) -> RLGroups:
    """One record per scored sample, its advantage taken within its group (first-seen order
    of groups, samples in order)."""
    if advantage not in ("mean", "std"):
        raise ConfigError(f"advantage must be 'mean' or 'std', got {advantage!r}")
    groups: dict[str, list[Sample]] = {}
    for item in samples:
        sample = item if isinstance(item, Sample) else Sample(item.run_id, item)
        groups.setdefault(run_group_id(sample), []).append(sample)
    out = RLGroups(records=[], groups=0, degenerate=0, partial=0, skipped=Counter())
    for members in groups.values():
        kept = sorted((s for s in members if is_scored(s.trajectory)), key=lambda s: s.trajectory.sample)
        dropped = [s for s in members if not is_scored(s.trajectory)]
        out.skipped.update(unscored_reason(s.trajectory) for s in dropped)
        if not kept:
            continue
        if dropped and complete_groups_only:
            out.skipped["partial_group"] += len(kept)
            continue
        if len(kept) < min_group_size:
            out.skipped["small_group"] += len(kept)
            continue
        stats = group_stats([s.trajectory.reward for s in kept], [s.trajectory.success for s in kept], len(dropped))
        if stats["degenerate"] and skip_degenerate:
            out.skipped["degenerate_group"] += len(kept)
            continue
        out.groups += 1
        out.degenerate += stats["degenerate"]
        out.partial += bool(dropped)
        out.records += [rl_record(s, stats, messages_of, advantage) for s in kept]
    return out


# -- token records: what a token-in/token-out policy sampled, for RL trainers ------------------


def token_records(samples: Iterable[Sample | Trajectory], skipped: Counter[str] | None = None) -> list[dict[str, Any]]:
    """One record per segment of every scored episode a token policy ran (``--policy
    tokens``; a segment is one trainable sequence, see ``TurnTokens``): ``prompt_ids`` (the
    segment's first prompt), ``response_ids`` (each turn's sampled tokens, then the next
    turn's observation tokens, up to the last reply), ``response_mask`` (1 on sampled tokens,
    0 on the environment's), ``response_logprobs`` (the sampler's; 0.0 under mask 0),
    ``weight_versions`` (one per turn), the episode's reward and end reason. Unscored
    episodes are left out and counted, as the other exports do; so are episodes without
    token turns (``no_tokens``: run with another policy)."""
    skipped = Counter() if skipped is None else skipped
    records: list[dict[str, Any]] = []
    for item in samples:
        sample = item if isinstance(item, Sample) else Sample(item.run_id, item)
        trajectory = sample.trajectory
        if not is_scored(trajectory):
            skipped[unscored_reason(trajectory)] += 1
            continue
        turns = [step.action.tokens for step in trajectory.steps if step.action.tokens is not None]
        if not turns:
            skipped["no_tokens"] += 1
            continue
        segments: dict[int, list[Any]] = {}
        for turn in turns:
            segments.setdefault(turn.segment, []).append(turn)
        for index, (segment, members) in enumerate(segments.items()):
            response: list[int] = []
            mask: list[int] = []
            logprobs: list[float] = []
            for position, turn in enumerate(members):
                if position:  # the environment's tokens between two replies
                    response += turn.prompt_ids
                    mask += [0] * len(turn.prompt_ids)
                    logprobs += [0.0] * len(turn.prompt_ids)
                response += turn.token_ids
                mask += [1] * len(turn.token_ids)
                logprobs += turn.logprobs
            records.append(
                {
                    "prompt_ids": members[0].prompt_ids,
                    "response_ids": response,
                    "response_mask": mask,
                    "response_logprobs": logprobs,
                    "reward": trajectory.reward,
                    "weight_versions": [turn.weight_version for turn in members],
                    "finish_reasons": [turn.finish_reason for turn in members],
                    "segment": segment,
                    "segments": len(segments),
                    "last_segment": index == len(segments) - 1,
                    **_identity(sample),
                }
            )
    return records


def export_tokens(
    sources: Source | Sequence[Source], out: str | Path, *, allow_mixed_runs: bool = False, write_empty: bool = True
) -> ExportSummary:
    """Write ``token_records`` of ``sources`` to ``out`` (JSONL, replaced whole)."""
    inputs = as_sources(sources)
    path = check_out(out, inputs)
    samples = samples_of(inputs, allow_mixed_runs)
    skipped: Counter[str] = Counter()
    records = token_records(samples, skipped)
    summary = write_records(path if records or write_empty else None, records, samples, skipped)
    summary.episodes = len({(r["run_id"], r["episode_id"]) for r in records})
    summary.groups = len({r["group_id"] for r in records})
    return summary


# -- files ------------------------------------------------------------------------------------


def check_out(out: str | Path, inputs: Sequence[Source]) -> Path:
    """Refuse an output that would destroy an input or cannot be a file, before any work."""
    path = Path(out)
    if path.is_dir():
        raise ConfigError(f"--out {path} is a directory; give a file name such as {path / 'data.jsonl'}")
    for source in inputs:
        if isinstance(source, str | Path) and Path(source).exists() and path.exists() and path.samefile(source):
            raise ConfigError(f"--out {path} is one of the input trajectory files; write the export elsewhere")
    return path


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        tmp.replace(path)
    except OSError as exc:
        if tmp.parent.is_dir():
            tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def _rates(records: list[dict[str, Any]]) -> tuple[float, float]:
    if not records:
        return 0.0, 0.0
    return sum(r["reward"] for r in records) / len(records), sum(r["resolved"] for r in records) / len(records)


def write_records(
    path: Path | None, records: list[dict[str, Any]], samples: Sequence[Any], skipped: Counter[str], **groups: int
) -> ExportSummary:
    """Write the records (JSONL; nothing when ``path`` is None) and say what was written;
    ``groups`` are the RL export's counts."""
    if path is not None:
        _write(path, records)
    mean_reward, resolved_rate = _rates(records)
    return ExportSummary(
        path="" if path is None else str(path),
        records=len(records),
        episodes=len(records),
        skipped=sum(skipped.values()),
        mean_reward=mean_reward,
        resolved_rate=resolved_rate,
        runs=list(dict.fromkeys(s.run for s in samples)),
        skipped_reasons=dict(skipped),
        **groups,
    )


def export(
    kind: str,
    sources: Source | Sequence[Source],
    out: str | Path,
    messages_of: MessagesOf,
    *,
    finish: Finish | None = None,
    min_reward: float | None = None,
    only_resolved: bool = False,
    advantage: Advantage = "mean",
    min_group_size: int = 1,
    skip_degenerate: bool = False,
    complete_groups_only: bool = False,
    allow_mixed_runs: bool = False,
    write_empty: bool = True,
) -> ExportSummary:
    """Write ``sft`` or ``rl`` (``grpo``) records of ``sources`` to ``out`` (JSONL, replaced
    whole: written to a temporary file, then renamed). Everything is checked before any work.
    With ``write_empty=False`` an export of no records leaves ``out`` as it was (the summary's
    ``path`` is then ""): an empty file is no dataset ``datasets`` can load."""
    if kind not in FORMATS:
        raise ConfigError(f"unknown export format {kind!r}; use one of {', '.join(FORMATS)}")
    if min_group_size < 1:
        raise ConfigError(f"min_group_size must be at least 1, got {min_group_size}")
    if min_reward is not None and not math.isfinite(min_reward):
        raise ConfigError(f"--min-reward (min_reward) must be a finite number, got {min_reward}")
    inputs = as_sources(sources)
    path = check_out(out, inputs)
    samples = samples_of(inputs, allow_mixed_runs)
    by_episode = {(s.run, s.trajectory.episode_id): s.trajectory for s in samples if is_scored(s.trajectory)}
    groups: dict[str, int] = {}
    if kind == "sft":
        skipped: Counter[str] = Counter()
        records = sft_records(samples, messages_of, min_reward=min_reward, only_resolved=only_resolved, skipped=skipped)
    else:
        result = rl_records(
            samples,
            messages_of,
            advantage=advantage,
            min_group_size=min_group_size,
            skip_degenerate=skip_degenerate,
            complete_groups_only=complete_groups_only,
        )
        records, skipped = result.records, result.skipped
        groups = {"groups": result.groups, "groups_degenerate": result.degenerate, "groups_partial": result.partial}
    if finish is not None:
        records = [finish(record, by_episode[(record["run_id"], record["episode_id"])]) for record in records]
    written = path if records or write_empty else None
    return write_records(written, records, samples, skipped, **groups)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments every recipe's export command takes (a recipe adds its own after)."""
    parser.add_argument(
        "format",
        choices=(*FORMATS, TOKENS),
        help="sft: one chat per good episode; rl (or grpo): one record per sample; tokens: the token ids, mask "
        "and logprobs of a token-policy run",
    )
    # The first file is ``args.trajectories`` (one path, as callers that check it expect), the rest apart.
    parser.add_argument("trajectories", help="trajectory file written by `orchard-async run` (.jsonl or .msgpack)")
    parser.add_argument(
        "more_trajectories", nargs="*", metavar="MORE", help="more trajectory files (of the same run, unless mixed)"
    )
    parser.add_argument("--out", required=True, help="output JSONL file")
    parser.add_argument(
        "--allow-mixed-runs",
        action="store_true",
        help="export trajectories of different runs together (groups stay apart, prefixed by run id)",
    )
    sft = parser.add_argument_group("sft")
    sft.add_argument(
        "--min-reward", type=float, default=None, help="keep episodes with reward >= this (default: resolved only)"
    )
    sft.add_argument("--only-resolved", action="store_true", help="also require resolved with --min-reward")
    rl = parser.add_argument_group("rl")
    rl.add_argument(
        "--advantage",
        choices=["mean", "std"],
        default="mean",
        help="mean: reward - group mean (default); std: also divided by the group's std (GRPO)",
    )
    rl.add_argument("--min-group-size", type=int, default=1, help="drop groups with fewer scored samples")
    rl.add_argument("--skip-degenerate", action="store_true", help="drop groups whose rewards are all equal")
    rl.add_argument(
        "--complete-groups-only",
        action="store_true",
        help="drop groups that lost a sample to an infrastructure failure (default: keep the scored ones)",
    )


# -- the command: `orchard-async export sft|rl RUN...`, for every recipe ---------------------------


def header_recipes(path: Path) -> list[str]:
    """The recipes the run headers of a trajectory file name, in order: one for a run's file,
    several for runs' files concatenated (each keeps its header); none for a file written
    without a run header (``collect`` without one, or an older version)."""
    # The file's records are walked with the trajectory module's own framing: a header is only
    # ever told apart there.
    from orchard_async.records.trajectory import _decode_header, _is_header, _is_msgpack, _record_ends

    msgpack = _is_msgpack(path)
    data = path.read_bytes()
    found: list[str] = []
    start = 0
    for end in _record_ends(data, msgpack):
        record = data[start + 4 : end] if msgpack else data[start:end]
        start = end
        if _is_header(record, msgpack):
            try:
                recipe = _decode_header(record, msgpack).get("recipe")
            except msgspec.DecodeError:
                continue  # a corrupt header names nothing; the reader skips it the same way
            if isinstance(recipe, str) and recipe and recipe not in found:
                found.append(recipe)
    return found


def recipe_of_inputs(paths: Sequence[Path], given: str | None = None) -> str:
    """The one recipe whose runs ``paths`` are, from their run headers (``given``: the
    ``--recipe`` of files that name none). Runs of different recipes are refused by name: a
    chat is one recipe's, and another recipe's builder would write a conversation no model saw."""
    named = {path: header_recipes(path) for path in paths}
    recipes = list(dict.fromkeys(recipe for found in named.values() for recipe in found))
    if len(recipes) > 1:
        which = "; ".join(f"{path}: {', '.join(found) or 'none named'}" for path, found in named.items())
        raise ConfigError(f"the inputs are runs of different recipes ({which}); export each recipe's runs on their own")
    if recipes and given and given != recipes[0]:
        raise ConfigError(
            f"--recipe {given}: the inputs are runs of the {recipes[0]} recipe (their run headers say so)"
        )
    unnamed = [str(path) for path, found in named.items() if not found]
    if unnamed and not given:
        raise ConfigError(
            f"{unnamed[0]} names no recipe (it has no run header: written by collect() without one, or by an "
            "older orchard-async); give the recipe that ran with --recipe NAME"
        )
    return given or recipes[0]


def refuse_other_recipes(paths: Sequence[Path], recipe: str, command: str) -> None:
    """A recipe's own export (``export-gui``, ``python -m ...swe.export``) takes its own runs
    only: a file whose run header names another recipe is refused, naming the command that
    exports it."""
    for path in paths:
        others = [name for name in header_recipes(path) if name != recipe]
        if others:
            raise ConfigError(
                f"{path} is a run of the {others[0]} recipe, not {recipe}; export it with "
                f"`orchard-async export` (it writes the chat of the recipe that ran), not {command}"
            )


EXPORT_HELP = "trajectories -> training data (SFT chats or RL groups, JSONL) in the chat of the recipe that ran"


def add_command(parser: argparse.ArgumentParser) -> None:
    """Fill the ``orchard-async export`` subcommand: the common arguments, ``--recipe``, and
    each installed recipe's own (its ``add_export_arguments(group)``, e.g. the GUI's
    ``--screenshots``). Called only when ``export`` is the command being run."""
    from orchard_async.runtime import load_recipe, recipe_names  # the registry: only when the command runs

    parser.description = EXPORT_HELP
    add_arguments(parser)
    parser.add_argument(
        "--recipe", help="the recipe of inputs that name none (no run header); by default read from the run header"
    )
    for name in recipe_names():
        try:
            recipe = load_recipe(name)
        except ConfigError:
            continue  # a recipe that cannot load here: its runs are refused with its own error when given
        add_own = getattr(recipe, "add_export_arguments", None)
        if callable(add_own):
            add_own(parser.add_argument_group(f"{name} recipe"))
    parser.set_defaults(func=export_command)


def export_command(args: argparse.Namespace) -> int:
    """Every input and the output are checked before any work; the recipe comes from the
    inputs' run headers. An export of no records writes nothing, says why, and exits 1."""
    from orchard_async.records.paths import check_output_file
    from orchard_async.records.trajectory import check_trajectory_file
    from orchard_async.runtime import load_recipe

    sources = [check_trajectory_file(path) for path in [args.trajectories, *(args.more_trajectories or [])]]
    out = check_output_file(args.out)
    if out.exists() and any(out.resolve() == source.resolve() for source in sources):
        raise ConfigError(f"--out {out} is a trajectory file being exported; write the export elsewhere")
    if args.format == TOKENS:  # the sampled ids themselves: no recipe's chat is involved
        summary = export_tokens(sources, out, allow_mixed_runs=args.allow_mixed_runs, write_empty=False)
        print_summary(summary, TOKENS, ", ".join(dict.fromkeys(r for p in sources for r in header_recipes(p))))
        return 0 if summary.records else 1
    name = recipe_of_inputs(sources, args.recipe)
    recipe = load_recipe(name)
    training_chats = getattr(recipe, "training_chats", None)
    if not callable(training_chats):
        raise ConfigError(f"the {name} recipe has no chat builder (training_chats): its runs cannot be exported")
    chats: Chats = training_chats(vars(args))
    summary = export(
        args.format,
        sources,
        out,
        chats.messages_of,
        finish=chats.finish,
        write_empty=False,
        **selection_options(args),
    )
    print_summary(summary, args.format, name)
    return 0 if summary.records else 1


def selection_options(args: argparse.Namespace) -> dict[str, Any]:
    """What the export command's options say about which samples become records, as
    ``export``'s keywords (every recipe's export command parses the same options)."""
    return {
        "min_reward": args.min_reward,
        "only_resolved": args.only_resolved,
        "advantage": args.advantage,
        "min_group_size": args.min_group_size,
        "skip_degenerate": args.skip_degenerate,
        "complete_groups_only": args.complete_groups_only,
        "allow_mixed_runs": args.allow_mixed_runs,
    }


def print_summary(summary: ExportSummary, kind: str, recipe: str) -> None:
    """One line on stderr: what was written (or that nothing was, and why)."""
    skipped = f"{summary.skipped} skipped" + (
        f": {', '.join(f'{k} {v}' for k, v in summary.skipped_reasons.items())}" if summary.skipped else ""
    )
    if not summary.records:
        line = f"{kind}: no records to export from the {recipe} run ({skipped}); nothing written"
    else:
        line = (
            f"{kind}: {summary.records} records ({summary.episodes} episodes, {summary.skipped} skipped), "
            f"resolved {summary.resolved_rate:.1%}, reward mean {summary.mean_reward:.3f}, "
            f"{'token records' if kind == TOKENS else recipe + ' chats'} -> {summary.path}"
        )
    print(line, file=sys.stderr)

"""Summaries of trajectory sets: what `demo`, `run` and `inspect` print."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import msgspec

from orchard_async.records.passk import summarize_groups
from orchard_async.records.trajectory import EndReason, Trajectory

# The ends the scorer judged (a reward means something): every other end is never in a rate.
SCORED_END_REASONS = frozenset(reason for reason in EndReason if reason.scored)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def percentile_ms(seconds: Sequence[float], q: float) -> float | None:
    """A percentile of durations in seconds, in milliseconds; None when nothing was timed."""
    return percentile(seconds, q) * 1000 if seconds else None


def share(part: float, whole: int) -> float | None:
    """``part / whole``; None when there is nothing to divide by (no episodes: no rate at all)."""
    return part / whole if whole else None


class Summary(msgspec.Struct, kw_only=True):
    episodes: int
    finished: int
    failed: int
    # Over the judged episodes only (finished with a scored end: the only ones a reward means
    # something for); None (printed "-") when none was judged: a rate over episodes nobody judged is no rate.
    success_rate: float | None
    mean_reward: float | None
    steps: int
    exit_reasons: dict[str, int]  # why episodes ended: EndReason values, most common first
    command_reasons: dict[str, int]  # ExitReason of every command
    retries: int
    exec_p50_ms: float | None  # None when no command ran
    exec_p99_ms: float | None
    wall_s: float | None = None
    steps_per_s: float | None = None
    episodes_per_s: float | None = None
    time_share: dict[str, float] = {}  # fraction of episode time in create/setup/agent/exec/score/destroy
    leaked: int | None = None
    # Episodes nobody could judge (never a reward, never exported): counted apart so they stand out.
    verifier_errors: int = 0
    model_unavailable: int = 0
    # Over tasks sampled more than once (groups): k -> mean over tasks, judged episodes only.
    pass_at_k: dict[str, float] = {}  # at least one of k samples passes
    pass_hat_k: dict[str, float] = {}  # all k samples pass
    judged: int = 0  # episodes the scorer judged: what success_rate and mean_reward are over


def summarize(trajectories: Iterable[Trajectory], *, wall_s: float | None = None, leaked: int | None = None) -> Summary:
    items = list(trajectories)
    exec_times = [step.exec_s for t in items for step in t.steps if step.reason is not None]
    steps = sum(len(t.steps) for t in items)
    phase_totals: Counter[str] = Counter()
    for t in items:
        for phase, seconds in t.timings.items():
            if phase != "total":
                phase_totals[phase] += seconds
    spent = sum(phase_totals.values()) or 1.0
    finished = sum(t.status == "finished" for t in items)
    judged = [t for t in items if t.status == "finished" and t.end_reason in SCORED_END_REASONS]
    groups = summarize_groups(items)
    repeated = groups["group_size"] > 1
    return Summary(
        episodes=len(items),
        finished=finished,
        failed=len(items) - finished,
        success_rate=share(sum(t.success for t in judged), len(judged)),
        mean_reward=share(sum(t.reward for t in judged), len(judged)),
        steps=steps,
        exit_reasons=dict(Counter(str(t.end_reason) for t in items).most_common()),
        command_reasons=dict(Counter(step.reason for t in items for step in t.steps if step.reason).most_common()),
        retries=sum(len(t.retries) for t in items),
        exec_p50_ms=percentile_ms(exec_times, 50),
        exec_p99_ms=percentile_ms(exec_times, 99),
        wall_s=wall_s,
        steps_per_s=steps / wall_s if wall_s else None,
        episodes_per_s=len(items) / wall_s if wall_s else None,
        time_share={phase: round(total / spent, 4) for phase, total in phase_totals.items()},
        leaked=leaked,
        verifier_errors=sum(t.end_reason == EndReason.VERIFIER_ERROR for t in items),
        model_unavailable=sum(t.end_reason == EndReason.MODEL_UNAVAILABLE for t in items),
        pass_at_k={str(k): round(v, 4) for k, v in groups["pass_at_k"].items()} if repeated else {},
        pass_hat_k={str(k): round(v, 4) for k, v in groups["pass_hat_k"].items()} if repeated else {},
        judged=len(judged),
    )


def to_json(summary: Summary) -> bytes:
    """JSON, no data as null (msgspec writes a NaN as null too, so any JSON reader takes it)."""
    return msgspec.json.encode(summary)

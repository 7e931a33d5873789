"""`bench episodes`: end-to-end rollout throughput of a recipe at a concurrency sweep.

Each level runs ``episodes`` episodes of the recipe's tasks with its policy through the
real rollout engine (pool, retries, trajectories), then reports episodes/s, steps/s,
episode duration percentiles, exec percentiles and where the time went (create, setup,
agent, exec, score, destroy; the shares of summed episode time, from each trajectory's
timings; where a task reports its test command's own time, ``tests`` is that and ``score``
the rest of scoring). Sandboxes left after each level are counted.

``group_size`` plans groups of samples per task (the level's episodes are rounded up to
whole groups). ``fork`` runs every level a second time, as ``<adapter>+fork``, with groups
of tasks that opt in (``fork_after_setup``, e.g. SWE) set up once and started from a snapshot
(``orchard_async.engine.groups``); the first run never forks. The forked run's ``setup`` share is
the groups' shared setup, counted once per group; ``group_wait`` is the time samples waited
for their group's base. ``warm`` adds a run of each with a warm pool (``<adapter>+warm``,
``<adapter>+fork+warm``: the engine keeps the next ``concurrency`` episodes' sandboxes
created ahead, ``orchard_async.engine.warm``); the runs without it pass ``warm=0``, so the baseline
is cold even where the engine warms by default (docker, kubernetes). The ratios table
compares every run with the plain cold one, level by level.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter

import anyio

from orchard_async import Pool, Trajectory, load_recipe, rollout, summarize
from orchard_async.apps.cli import close_policy
from orchard_async.bench.common import ForkingTrackingAdapter, TrackingAdapter, close_and_count, open_adapter
from orchard_async.bench.report import Comparison, Row, ms_percentiles
from orchard_async.bench.scenario import Outcome


async def run_episodes(
    adapter_name: str,
    *,
    concurrency: list[int],
    episodes: int,
    recipe: str = "toy",
    tasks: str = "builtin",
    policy: str = "oracle",
    adapter_options: dict | None = None,
    max_retries: int = 2,
    group_size: int = 1,
    fork: bool = False,
    warm: bool = False,
) -> Outcome:
    module = load_recipe(recipe)
    module.load_tasks(tasks)  # a task source that does not load fails here, before any sandbox
    agent = module.make_policy(policy)
    inner, doctor = await open_adapter(adapter_name, adapter_options)
    adapter = TrackingAdapter(inner)  # no snapshot(): every episode creates and sets up its own sandbox
    # With fork, each level runs twice on the same adapter: as above, then with groups of tasks
    # that opt in set up once and forked (orchard_async.engine.groups).
    forking = ForkingTrackingAdapter(inner) if fork else None
    variants: list[tuple[str, TrackingAdapter, bool]] = [(adapter_name, adapter, False)]
    if forking is not None:
        variants.append((f"{adapter_name}+fork", forking, False))
    if warm:
        variants += [(f"{subject}+warm", runner, True) for subject, runner, _ in variants]
    outcome = Outcome()
    if doctor:
        outcome.details["adapter_doctor"] = doctor
    lost_total = 0
    per_level = {}
    try:
        for level, (subject, runner, warmed) in itertools.product(concurrency, variants):
            n = -(-max(episodes, level) // group_size) * group_size  # whole groups
            finished: list[Trajectory] = []
            # Tasks loaded anew for every run: what a recipe caches per process (SWE's harness
            # proofs) is paid by each run alike, not by the first one only.
            task_list = module.load_tasks(tasks)
            started = time.perf_counter()
            pool = Pool(runner)  # the run's own, to read what its warm pool served
            stream = rollout(
                task_list,
                agent,
                pool,
                n=n,
                group_size=group_size,
                concurrency=level,
                max_retries=max_retries,
                warm=level if warmed else 0,
            )
            async with pool, contextlib.aclosing(stream):
                async for trajectory in stream:
                    finished.append(trajectory)
            wall = time.perf_counter() - started
            owned = len(await adapter.list_owned())  # the engine destroys every sandbox it made
            summary = summarize(finished, wall_s=wall, leaked=owned)
            durations = [t.timings.get("total", 0.0) for t in finished if t.timings]
            # until the agent's first turn: the sandbox and the task's setup (a browser, a checkout)
            setups = ms_percentiles(
                [t.timings.get("create", 0.0) + t.timings.get("setup", 0.0) for t in finished if t.timings]
            )
            ids = Counter(t.episode_id for t in finished)
            lost = n - len(ids)
            lost_total += lost
            outcome.rows.append(
                Row(
                    subject=subject,
                    operation="episode",
                    concurrency=level,
                    episodes=len(finished),
                    steps=summary.steps,
                    episodes_per_s=round(summary.episodes_per_s or 0.0, 2),
                    steps_per_s=round(summary.steps_per_s or 0.0, 1),
                    success_rate=None if summary.success_rate is None else round(summary.success_rate, 4),
                    errors=summary.failed,
                    wall_s=round(wall, 3),
                    time_share=_with_test_share(summary.time_share, finished),
                    extra={
                        "exec_p50_ms": _round(summary.exec_p50_ms),
                        "exec_p99_ms": _round(summary.exec_p99_ms),
                        "end_reasons": summary.exit_reasons,
                        "retries": summary.retries,
                        "setup_p50_ms": setups["p50_ms"],
                        "setup_p99_ms": setups["p99_ms"],
                        "group_size": group_size,
                        "forked": sum(bool(t.forked_from) for t in finished),
                        "warm": pool.warm_stats,
                    },
                    **ms_percentiles(durations),
                )
            )
            per_level[str(level) if len(variants) == 1 else f"{subject}@{level}"] = {
                "planned": n,
                "lost": lost,
                "duplicates": sum(c - 1 for c in ids.values()),
                "owned_after": owned,
            }
    except BaseException:
        with anyio.CancelScope(shield=True):
            await adapter.close()
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await close_policy(agent)  # optional (Policy): a model policy's HTTP client
    ours = adapter.created + (forking.created if forking else [])
    leftovers = await close_and_count(adapter, adapter_name, adapter_options or {}, ours)
    if forking is not None:
        leftovers["snapshots_taken"] = forking.snapshots_taken
        leftovers["snapshots_not_dropped"] = len(forking.snapshots)
        leftovers["leaked"] += len(forking.snapshots)
    if len(variants) > 1:
        outcome.comparisons = _ratios_to_plain(outcome.rows, adapter_name)
    outcome.lost = lost_total
    outcome.leaked = leftovers["leaked"]
    outcome.details["leftovers"] = leftovers
    outcome.details.update({"recipe": recipe, "tasks": tasks, "policy": policy, "levels": per_level})
    outcome.notes.append("p50/p99 ms are whole-episode durations; exec percentiles are in each row's extra")
    return outcome


def _ratios_to_plain(rows: list[Row], baseline: str) -> list[Comparison]:
    """Each run (forked, warm) against the plain cold one at each level: episode p50/p99 and episodes/s."""
    plain = {row.concurrency: row for row in rows if row.subject == baseline}
    return [
        Comparison(
            subject=row.subject,
            baseline=baseline,
            concurrency=row.concurrency,
            p50_ratio=_ratio(row.p50_ms, plain[row.concurrency].p50_ms),
            p99_ratio=_ratio(row.p99_ms, plain[row.concurrency].p99_ms),
            ops_ratio=_ratio(row.episodes_per_s, plain[row.concurrency].episodes_per_s),
        )
        for row in rows
        if row.subject != baseline and row.concurrency in plain
    ]


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _with_test_share(shares: dict[str, float], finished: list[Trajectory]) -> dict[str, float]:
    """For a task that reports its test command's own time (``test_s`` in the reward info,
    as SWE does), ``score`` split in two: ``tests``, that command, and ``score``, the rest of
    scoring (the scorer's sandbox, checkout, patches). The shares still sum to 1."""
    spent = sum(t.timings.get("total", 0.0) for t in finished if t.timings)
    tests = sum(float(t.info["test_s"]) for t in finished if isinstance(t.info.get("test_s"), int | float))
    if not tests or not spent or "score" not in shares:
        return shares
    share = min(round(tests / spent, 4), shares["score"])
    return {**shares, "score": round(shares["score"] - share, 4), "tests": share}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)  # None: no commands

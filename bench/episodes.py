"""`bench episodes`: end-to-end rollout throughput of a recipe at a concurrency sweep.

Each level runs ``episodes`` episodes of the recipe's tasks with its policy through the
real rollout engine (pool, retries, trajectories), then reports episodes/s, steps/s,
episode duration percentiles, exec percentiles and where the time went (create, setup,
agent, exec, score, destroy; the shares of summed episode time, from each trajectory's
timings; where a task reports its test command's own time, ``tests`` is that and ``score``
the rest of scoring). Sandboxes left after each level are counted.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter

import anyio

from orchard_async import Trajectory, load_recipe, rollout, summarize

from .common import TrackingAdapter, close_and_count, open_adapter
from .report import Row, ms_percentiles
from .scenario import Outcome


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
) -> Outcome:
    module = load_recipe(recipe)
    task_list = module.load_tasks(tasks)
    agent = module.make_policy(policy)
    inner, doctor = await open_adapter(adapter_name, adapter_options)
    adapter = TrackingAdapter(inner)
    outcome = Outcome()
    if doctor:
        outcome.details["adapter_doctor"] = doctor
    lost_total = 0
    per_level = {}
    try:
        for level in concurrency:
            n = max(episodes, level)
            finished: list[Trajectory] = []
            started = time.perf_counter()
            stream = rollout(task_list, agent, adapter, n=n, concurrency=level, max_retries=max_retries)
            async with contextlib.aclosing(stream):
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
                    subject=adapter_name,
                    operation="episode",
                    concurrency=level,
                    episodes=len(finished),
                    steps=summary.steps,
                    episodes_per_s=round(summary.episodes_per_s or 0.0, 2),
                    steps_per_s=round(summary.steps_per_s or 0.0, 1),
                    success_rate=round(summary.success_rate, 4),
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
                    },
                    **ms_percentiles(durations),
                )
            )
            per_level[str(level)] = {
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
        aclose = getattr(agent, "aclose", None)  # optional (Policy): a model policy's HTTP client
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()
    leftovers = await close_and_count(adapter, adapter_name, adapter_options or {}, adapter.created)
    outcome.lost = lost_total
    outcome.leaked = leftovers["leaked"]
    outcome.details["leftovers"] = leftovers
    outcome.details.update({"recipe": recipe, "tasks": tasks, "policy": policy, "levels": per_level})
    outcome.notes.append("p50/p99 ms are whole-episode durations; exec percentiles are in each row's extra")
    return outcome


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


def _round(value: float) -> float | None:
    return None if value != value else round(value, 3)  # NaN (no commands) -> None

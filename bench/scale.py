"""`bench scale`: the core's own cost as the work grows.

Each level runs N concurrent episodes of S steps on the sim adapter with zero latency
(no real process behind a command), so what is measured is the engine: pool, episode
loop, trajectories, the event loop. Every level runs in a fresh interpreter, so its
peak RSS is its own and not the high-water mark of an earlier, bigger level. A ticker
task measures event-loop lag (how late a 10 ms sleep wakes up) during the rollout.

DESIGN.md target: 10,000 concurrent episodes at >= 20,000 steps/s and < 1 GiB peak RSS.
"""

from __future__ import annotations

import asyncio
import json
import sys

import anyio

from orchard_async.bench.report import Row
from orchard_async.bench.scenario import Outcome

TARGET = {"episodes": 10_000, "steps_per_s": 20_000, "peak_rss_mb": 1024}


async def run_level(episodes: int, steps: int, adapter: str, adapter_options: str | None, limit: float) -> dict:
    argv = [
        sys.executable,
        "-m",
        "orchard_async.bench._child",
        "scale",
        "--episodes",
        str(episodes),
        "--steps",
        str(steps),
        "--adapter",
        adapter,
    ]
    if adapter_options:
        argv += ["--adapter-options", adapter_options]
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        with anyio.fail_after(limit):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()  # our own child, by its handle
        await process.wait()
        raise RuntimeError(f"scale level {episodes} did not finish within {limit:.0f}s") from None
    if process.returncode != 0:
        raise RuntimeError(
            f"scale level {episodes} failed (exit {process.returncode}): {err.decode(errors='replace')[-2000:]}"
        )
    return json.loads(out.decode().strip().splitlines()[-1])


async def run_scale(
    levels: list[int],
    *,
    steps: int = 20,
    adapter_name: str = "sim",
    adapter_options: str | None = None,
    level_limit: float = 900.0,
) -> Outcome:
    outcome = Outcome()
    leaked = 0
    for episodes in levels:
        data = await run_level(episodes, steps, adapter_name, adapter_options, level_limit)
        leaked += data["leaked"]
        outcome.rows.append(
            Row(
                subject=adapter_name,
                concurrency=episodes,
                episodes=data["episodes"],
                steps=data["steps"],
                steps_per_s=data["steps_per_s"],
                episodes_per_s=data["episodes_per_s"],
                peak_rss_mb=data["peak_rss_mb"],
                loop_lag_p99_ms=data["loop_lag_p99_ms"],
                success_rate=round(data["finished"] / episodes, 4) if episodes else None,
                errors=episodes - data["finished"],
                wall_s=data["wall_s"],
                time_share=data["time_share"],
                extra={
                    "baseline_rss_mb": data["baseline_rss_mb"],
                    "cpu_s": data["cpu_s"],
                    "steps_per_cpu_s": data["steps_per_cpu_s"],
                    "kib_per_episode": round(
                        (data["peak_rss_mb"] - data["baseline_rss_mb"]) * 1024 / max(1, episodes), 1
                    ),
                    "loop_lag_p50_ms": data["loop_lag_p50_ms"],
                    "loop_lag_max_ms": data["loop_lag_max_ms"],
                    "end_reasons": data["end_reasons"],
                },
            )
        )
    outcome.leaked = leaked
    at_target = [row for row in outcome.rows if row.episodes == TARGET["episodes"]]
    if at_target:
        row = at_target[0]
        met = (row.steps_per_s or 0) >= TARGET["steps_per_s"] and (row.peak_rss_mb or 0) < TARGET["peak_rss_mb"]
        outcome.details["target"] = {**TARGET, "met": met}
        outcome.notes.append(
            f"DESIGN target at {TARGET['episodes']:,} episodes: >= {TARGET['steps_per_s']:,} steps/s and "
            f"< {TARGET['peak_rss_mb']} MB peak RSS: {'met' if met else 'NOT met'} "
            f"({row.steps_per_s:,.0f} steps/s, {row.peak_rss_mb:,.0f} MB)"
        )
    outcome.details.update({"steps_per_episode": steps, "adapter_options": adapter_options or "{}"})
    outcome.notes.append("each level ran in a fresh interpreter; concurrency = episodes (all at once)")
    return outcome

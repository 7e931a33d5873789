"""Processes the harness starts: ``scale`` (one level of the scale scenario, in a fresh
interpreter so peak RSS is that level's) and ``controller`` (a rollout the chaos scenario
SIGKILLs mid-way). Each prints one JSON object on its last stdout line.

    python -m orchard_async.bench._child scale --episodes 10000 --steps 20
    python -m orchard_async.bench._child controller --adapter local --out T.jsonl ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections import Counter

from orchard_async import SandboxSpec, get_adapter, rollout, run
from orchard_async.bench.common import LoopLag, current_rss_mb, peak_rss_mb
from orchard_async.bench.tasks import RepeatPolicy, steps_tasks


async def scale(args: argparse.Namespace) -> dict:
    baseline_rss = current_rss_mb()
    adapter = get_adapter(args.adapter, **json.loads(args.adapter_options or "{}"))
    tasks = steps_tasks(8, steps=args.steps, spec=SandboxSpec(ttl=3600))
    policy = RepeatPolicy()
    count = steps = finished = 0
    ends: Counter[str] = Counter()
    shares: Counter[str] = Counter()
    started = time.perf_counter()
    cpu_started = time.process_time()
    async with LoopLag(args.lag_interval) as lag:
        stream = rollout(tasks, policy, adapter, n=args.episodes, concurrency=args.episodes, max_retries=0)
        async with contextlib.aclosing(stream):
            async for trajectory in stream:
                count += 1
                steps += len(trajectory.steps)
                finished += trajectory.status == "finished"
                ends[trajectory.end_reason] += 1
                for phase, seconds in trajectory.timings.items():
                    if phase != "total":
                        shares[phase] += seconds
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    leaked = len(await adapter.list_owned())
    await adapter.close()
    spent = sum(shares.values()) or 1.0
    return {
        "episodes": count,
        "finished": finished,
        "steps": steps,
        "wall_s": round(wall, 3),
        "steps_per_s": round(steps / wall, 1),
        "cpu_s": round(cpu, 3),  # this process's CPU time: steps per CPU-second is what load does not skew
        "steps_per_cpu_s": round(steps / cpu, 1) if cpu else None,
        "episodes_per_s": round(count / wall, 1),
        "peak_rss_mb": peak_rss_mb(),
        "baseline_rss_mb": baseline_rss,
        "loop_lag_p50_ms": lag.p(50),
        "loop_lag_p99_ms": lag.p(99),
        "loop_lag_max_ms": lag.p(100),
        "lag_samples": len(lag.samples),
        "end_reasons": dict(ends),
        "time_share": {phase: round(total / spent, 4) for phase, total in shares.items()},
        "leaked": leaked,
        "pid": os.getpid(),
    }


async def controller(args: argparse.Namespace) -> dict:
    """A rollout into ``--out`` that runs until it is killed (or ends)."""
    from orchard_async import collect

    adapter = get_adapter(args.adapter, **json.loads(args.adapter_options or "{}"))
    spec = SandboxSpec(ttl=args.ttl, image=args.image, labels={"orchard.bench": args.label})
    tasks = steps_tasks(4, steps=args.steps, command=args.command, spec=spec, exec_timeout=30.0, deadline=300.0)
    print(json.dumps({"started": os.getpid()}), flush=True)
    result = await collect(
        tasks, RepeatPolicy(), adapter, args.out, resume=True, n=args.episodes, concurrency=args.concurrency
    )
    await adapter.close()
    return {"written": result.written}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="orchard_async.bench._child")
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("scale")
    p.add_argument("--adapter", default="sim")
    p.add_argument("--adapter-options")
    p.add_argument("--episodes", type=int, required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lag-interval", type=float, default=0.01)
    p.add_argument("--profile", help="write cProfile stats of the rollout to this file")
    c = sub.add_parser("controller")
    c.add_argument("--adapter", default="local")
    c.add_argument("--adapter-options")
    c.add_argument("--image")
    c.add_argument("--out", required=True)
    c.add_argument("--label", required=True)
    c.add_argument("--episodes", type=int, default=32)
    c.add_argument("--concurrency", type=int, default=8)
    c.add_argument("--steps", type=int, default=6)
    c.add_argument("--command", default="sleep 0.2")
    c.add_argument("--ttl", type=float, default=600.0)
    args = parser.parse_args(argv)
    target = scale if args.mode == "scale" else controller
    if getattr(args, "profile", None):
        import cProfile

        profiler = cProfile.Profile()
        result = profiler.runcall(run, target, args)
        profiler.dump_stats(args.profile)
    else:
        result = run(target, args)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

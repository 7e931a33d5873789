"""`bench exec`: command round trip through an adapter, next to the floors for that
adapter and (with ``--peers``) other projects' runtimes, all in the same run.

At each concurrency C, C loops run at once, each on its own sandbox, each sending the
same command back to back; each floor runs the same loops on the cheapest way to run a
command on that backend. Adapter and floors alternate level by level, so a change in
machine load hits both.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import anyio

from orchard_async import Adapter, Sandbox, SandboxSpec
from orchard_async.bench.common import Op, close_and_count, measure, open_adapter
from orchard_async.bench.floors import FLOORS, PEERS, Baseline, Context
from orchard_async.bench.report import Row, compare_rows, latency_row
from orchard_async.bench.scenario import Outcome

CREATE_PARALLEL = 32  # sandboxes created at once while setting up a level


async def create_many(adapter: Adapter, spec: SandboxSpec, count: int, created: list[str]) -> list[Sandbox]:
    limiter = anyio.CapacityLimiter(CREATE_PARALLEL)
    sandboxes: list[Sandbox] = []

    async def one() -> None:
        async with limiter:
            sandbox = await adapter.create(spec)
        created.append(sandbox.id)
        sandboxes.append(sandbox)

    try:
        async with anyio.create_task_group() as group:
            for _ in range(count):
                group.start_soon(one)
    except BaseException:
        await close_all(sandboxes)
        raise
    return sandboxes


async def close_all(sandboxes: list[Sandbox]) -> None:
    with anyio.CancelScope(shield=True):
        async with anyio.create_task_group() as group:
            for sandbox in sandboxes:
                group.start_soon(sandbox.close)


class ResultCounter:
    def __init__(self) -> None:
        self.errors = 0
        self.reasons: dict[str, int] = {}

    def wrap(self, call: Any) -> Op:
        async def op() -> None:
            result = await call()
            if not result.ok:
                self.errors += 1
                self.reasons[result.reason.value] = self.reasons.get(result.reason.value, 0) + 1

        return op


async def bench_adapter(
    adapter: Adapter,
    name: str,
    spec: SandboxSpec,
    command: str,
    level: int,
    per_loop: int,
    created: list[str],
    *,
    session: bool = False,
) -> Row:
    sandboxes = await create_many(adapter, spec, level, created)
    counter = ResultCounter()
    try:
        if not session:
            ops = [counter.wrap(lambda s=s: s.exec(command, timeout=60)) for s in sandboxes]
            latencies, wall = await measure(ops, per_loop)
        else:  # a stateful session per sandbox: what an interactive agent (and SWE-ReX) uses
            async with AsyncExitStack() as stack:
                sessions = [await stack.enter_async_context(s.session()) for s in sandboxes]
                ops = [counter.wrap(lambda s=s: s.exec(command, timeout=60)) for s in sessions]
                latencies, wall = await measure(ops, per_loop)
    finally:
        await close_all(sandboxes)
    extra = {"reasons": counter.reasons} if counter.reasons else {}
    return latency_row(
        f"{name}:session" if session else name, level, latencies, wall, errors=counter.errors, extra=extra
    )


async def bench_baseline(baseline: Baseline, ops: list[Op], level: int, per_loop: int) -> Row:
    per_loop = min(baseline.per_loop, per_loop) if baseline.per_loop else per_loop
    if baseline.max_ops:
        per_loop = max(1, min(per_loop, baseline.max_ops // level))
    latencies, wall = await measure(ops[:level], per_loop)
    return latency_row(baseline.name, level, latencies, wall)


def _levels(baseline: Baseline, concurrency: list[int]) -> list[int]:
    return [level for level in concurrency if baseline.max_concurrency is None or level <= baseline.max_concurrency]


async def run_exec(
    adapter_name: str,
    *,
    concurrency: list[int],
    ops: int,
    command: str = "true",
    adapter_options: dict | None = None,
    image: str | None = None,
    peers: bool = False,
    session: bool = False,
    floors: bool = True,
) -> Outcome:
    """Rows for the adapter, its floors and the peers at each concurrency."""
    options = adapter_options or {}
    if (session or peers) and 1 not in concurrency:
        concurrency = [1, *concurrency]  # sessions and peers are compared at concurrency 1
    ctx = Context(adapter_name, options, command, image)
    outcome = Outcome()
    baselines: list[Baseline] = []
    candidates = (FLOORS.get(adapter_name, []) if floors else []) + (PEERS if peers else [])
    if floors and adapter_name not in FLOORS:
        outcome.notes.append(f"no floor is registered for the {adapter_name} adapter (bench/floors.py): measured alone")
    for baseline in candidates:
        reason = await anyio.to_thread.run_sync(baseline.available, ctx)
        if reason:
            outcome.notes.append(f"{baseline.name} skipped: {reason}")
        else:
            baselines.append(baseline)
            outcome.notes.append(f"{baseline.name}: {baseline.what}")
    adapter, doctor = await open_adapter(adapter_name, options)
    if doctor:
        outcome.details["adapter_doctor"] = doctor
    spec = SandboxSpec(ttl=900, image=image)
    created: list[str] = []
    rows = outcome.rows
    try:
        async with AsyncExitStack() as stack:
            # Each baseline is set up once (a floor container, peer sessions) for its largest level.
            opened = {
                baseline.name: await stack.enter_async_context(baseline.open(ctx, max(_levels(baseline, concurrency))))
                for baseline in baselines
                if _levels(baseline, concurrency)
            }
            for level in concurrency:
                per_loop = max(5, ops // level)
                rows.append(await bench_adapter(adapter, adapter_name, spec, command, level, per_loop, created))
                for baseline in baselines:
                    if level in _levels(baseline, concurrency):
                        rows.append(await bench_baseline(baseline, opened[baseline.name], level, per_loop))
                if (session or peers) and level == 1:
                    rows.append(
                        await bench_adapter(adapter, adapter_name, spec, command, 1, per_loop, created, session=True)
                    )
    except BaseException:
        with anyio.CancelScope(shield=True):
            await adapter.close()
        raise
    leftovers = await close_and_count(adapter, adapter_name, options, created)
    outcome.leaked = leftovers["leaked"]
    outcome.details["sandboxes_created"] = len(created)
    outcome.details["leftovers"] = leftovers
    for baseline in baselines:
        if baseline.name.startswith("floor:"):
            outcome.comparisons += compare_rows(rows, adapter_name, baseline.name)
        else:
            outcome.comparisons += compare_rows(rows, f"{adapter_name}:session", baseline.name)
            outcome.comparisons += compare_rows(rows, adapter_name, baseline.name)
        if baseline.max_concurrency and max(concurrency) > baseline.max_concurrency:
            outcome.notes.append(
                f"{baseline.name} measured only up to concurrency {baseline.max_concurrency}: its async API blocks the event loop"
            )
    return outcome

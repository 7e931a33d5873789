"""`bench exec`: command round trip through an adapter, next to the floor for that adapter.

At each concurrency C, C loops run at once, each on its own sandbox, each sending the
same command back to back; the floor runs the same loops on the cheapest way to run a
command on that backend (for local: a bare ``asyncio.create_subprocess_exec``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import anyio

from orchard_async import SandboxSpec, get_adapter
from orchard_async.protocols import Adapter

from .report import Row, latency_row

Op = Callable[[], Awaitable[object]]


async def measure(make_ops: list[Op], per_loop: int) -> tuple[list[float], float]:
    """Run each op ``per_loop`` times, all loops at once; return latencies and wall time."""
    latencies: list[float] = []

    async def loop(op: Op) -> None:
        for _ in range(per_loop):
            start = time.perf_counter()
            await op()
            latencies.append(time.perf_counter() - start)

    for op in make_ops:  # one warm-up call each, not counted
        await op()
    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for op in make_ops:
            group.start_soon(loop, op)
    return latencies, time.perf_counter() - started


async def spawn_true() -> None:
    process = await asyncio.create_subprocess_exec("/bin/true")
    await process.wait()


FLOORS: dict[str, dict[str, Callable[[], Op]]] = {
    "local": {"floor:spawn": lambda: spawn_true},
    "sim": {},
}


async def bench_adapter(adapter: Adapter, name: str, command: str, concurrency: int, per_loop: int) -> Row:
    sandboxes = []
    try:
        for _ in range(concurrency):
            sandboxes.append(await adapter.create(SandboxSpec(ttl=600)))

        def op_for(sandbox: object) -> Op:
            return lambda: sandbox.exec(command, timeout=60)  # type: ignore[attr-defined]

        latencies, wall = await measure([op_for(s) for s in sandboxes], per_loop)
        return latency_row(name, concurrency, latencies, wall)
    finally:
        with anyio.CancelScope(shield=True):
            for sandbox in sandboxes:
                await adapter.destroy(sandbox)


async def run_exec(
    adapter_name: str, *, concurrency: list[int], ops: int, command: str = "true", adapter_options: dict | None = None
) -> tuple[list[Row], int]:
    """Rows for the adapter and its floors at each concurrency; and sandboxes leaked."""
    adapter = get_adapter(adapter_name, **(adapter_options or {}))
    rows: list[Row] = []
    try:
        for level in concurrency:
            per_loop = max(5, ops // level)
            rows.append(await bench_adapter(adapter, adapter_name, command, level, per_loop))
            for floor_name, make in FLOORS.get(adapter_name, {}).items():
                latencies, wall = await measure([make() for _ in range(level)], per_loop)
                rows.append(latency_row(floor_name, level, latencies, wall))
        leaked = len(await adapter.list_owned())
    finally:
        await adapter.close()
    return rows, leaked

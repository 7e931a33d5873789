"""Pieces every scenario uses: timed loops, the event-loop lag ticker, opening an adapter
by name, and counting what a run left behind."""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio

from orchard_async import Adapter, get_adapter, percentile
from orchard_async.capabilities import Doctor
from orchard_async.kit import procfs

Op = Callable[[], Awaitable[object]]


async def measure(ops: list[Op], per_loop: int, *, warmup: bool = True) -> tuple[list[float], float]:
    """Run each op ``per_loop`` times, all loops at once; return latencies (s) and wall time."""
    latencies: list[float] = []

    async def loop(op: Op) -> None:
        for _ in range(per_loop):
            start = time.perf_counter()
            await op()
            latencies.append(time.perf_counter() - start)

    if warmup:  # one call each, not counted: first-use costs are not the round trip
        async with anyio.create_task_group() as group:
            for op in ops:
                group.start_soon(op)
    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for op in ops:
            group.start_soon(loop, op)
    return latencies, time.perf_counter() - started


class LoopLag:
    """Measures how late the event loop wakes a sleeping task: a ticker sleeps ``interval``
    again and again and records the overshoot. Under load the overshoot is how long a
    ready callback waits for its turn, i.e. what every timeout and every I/O wake-up pays."""

    def __init__(self, interval: float = 0.01):
        self.interval = interval
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval)
            self.samples.append(max(0.0, loop.time() - start - self.interval))

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def p(self, q: float) -> float | None:
        return round(percentile(self.samples, q) * 1000, 3) if self.samples else None


def peak_rss_mb() -> float:
    """This process's peak resident set size: ``VmHWM``, the high-water mark of this
    process image. (``ru_maxrss`` is not used: Linux carries it across exec, so a child
    would report its parent's size at fork time when that was larger.)"""
    peak = procfs.status_kib("VmHWM")
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / 1024, 1)


def current_rss_mb() -> float:
    resident = procfs.status_kib("VmRSS")
    return peak_rss_mb() if resident is None else round(resident / 1024, 1)


async def open_adapter(name: str, options: dict[str, Any] | None = None) -> tuple[Adapter, str | None]:
    """The adapter by name, checked: an adapter with a ``doctor()`` must pass it first (so a
    missing daemon is one clear error, not a thousand failed creates). Returns the adapter
    and what its doctor said."""
    adapter = get_adapter(name, **(options or {}))
    notes = await adapter.doctor() if isinstance(adapter, Doctor) else None
    return adapter, notes


async def close_and_count(adapter: Adapter, name: str, options: dict[str, Any], ours: Iterable[str]) -> dict[str, Any]:
    """End a run the way a user's program ends, then count what is left of its sandboxes
    ``ours``: ``close()`` the adapter (it destroys what it still owns), ask it what it still
    lists as owned, then let a fresh adapter's ``reap`` look for this run's sandboxes.
    ``leaked`` is the union of both; it must be 0."""
    ours = set(ours)
    with anyio.CancelScope(shield=True):
        owned_at_end = len(await adapter.list_owned())
        await adapter.close()
        owned = set(await adapter.list_owned())
        reaper = get_adapter(name, **options)
        try:
            reaped = set(await reaper.reap(0.0))
        finally:
            await reaper.close()
    return {
        "owned_at_end": owned_at_end,  # not yet destroyed (or not yet confirmed) when the work ended
        "owned_after_close": len(owned),
        "reaped": len(reaped & ours),
        "reaped_other_runs": len(reaped - ours),  # dead runs of someone else: removed, not counted
        "leaked": len(owned | (reaped & ours)),
    }


def safe_call(fn: Callable[[], Any], default: Any = None) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - informational only
        return default


class TrackingAdapter:
    """Passes everything to the adapter and remembers the ids it created, so leftovers can
    be matched against this run's sandboxes (``reap`` also sees other runs')."""

    def __init__(self, inner: Adapter):
        self.inner = inner
        self.name = inner.name
        self.created: list[str] = []

    async def create(self, spec: Any) -> Any:
        sandbox = await self.inner.create(spec)
        self.created.append(sandbox.id)
        return sandbox

    async def list_owned(self) -> list[str]:
        return await self.inner.list_owned()

    async def reap(self, older_than: float = 0.0) -> list[str]:
        return await self.inner.reap(older_than)

    async def close(self) -> None:
        await self.inner.close()

    async def __aenter__(self) -> TrackingAdapter:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.__aexit__(*exc)


class ForkingTrackingAdapter(TrackingAdapter):
    """A ``TrackingAdapter`` that also passes snapshots through (so the rollout engine forks
    groups of tasks that opt in; see orchard_async.engine.groups), counting those not dropped."""

    def __init__(self, inner: Adapter):
        super().__init__(inner)
        self.snapshots: set[str] = set()
        self.snapshots_taken = 0

    async def snapshot(self, sandbox: Any) -> str:
        snapshot_id = await self.inner.snapshot(sandbox)  # type: ignore[attr-defined]
        self.snapshots.add(snapshot_id)
        self.snapshots_taken += 1
        return snapshot_id

    async def drop_snapshot(self, snapshot_id: str) -> None:
        await self.inner.drop_snapshot(snapshot_id)  # type: ignore[attr-defined]
        self.snapshots.discard(snapshot_id)

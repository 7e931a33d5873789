"""`bench burst --warm W`: acquire latency through the pool, cold and from a warm pool, in one run.

Both phases use one adapter and the burst's shape: N sandboxes asked for at once through
``Pool.acquire``, each runs K commands and is closed. Cold: every acquire is a create.
Warm: the pool is first filled with W sandboxes (``Pool.warm``; the time to fill is reported,
it is work moved off the episode's path, not removed), then the N acquires are made, each
taking a warm sandbox (after its check: a ping its shell answers, ``warm._healthy``) while one
is ready, else a create under way or its own. Reported per phase: acquire p50/p99, where each
acquire's sandbox came from, and the round trips of the phase's commands (``exec_p50_ms``) and
of one ping per sandbox made after its acquire (``ping_p50_ms``: what a check costs at that
moment); then what is left (``list_owned`` and ``reap``, must be 0).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import anyio

from orchard_async import Pool, SandboxSpec, percentile
from orchard_async.bench.common import TrackingAdapter, close_and_count, open_adapter
from orchard_async.bench.report import latency_row
from orchard_async.bench.scenario import Outcome
from orchard_async.capabilities import Ping


async def run_warm_burst(
    adapter_name: str,
    *,
    sandboxes: int,
    warm: int,
    commands: int,
    command: str = "true",
    adapter_options: dict | None = None,
    image: str | None = None,
    op_timeout: float = 300.0,
    max_creating: int | None = None,
) -> Outcome:
    inner, doctor = await open_adapter(adapter_name, adapter_options)
    adapter = TrackingAdapter(inner)
    outcome = Outcome()
    if doctor:
        outcome.details["adapter_doctor"] = doctor
    spec = SandboxSpec(ttl=max(600.0, op_timeout * 3), image=image, labels={"orchard.bench": "burst-warm"})
    failures: dict[str, Counter[str]] = defaultdict(Counter)
    acquire_failed: Counter[str] = Counter()
    execs: dict[str, list[float]] = defaultdict(list)  # the commands' round trips: what the old check cost
    pings: dict[str, list[float]] = defaultdict(list)  # the shell's answer to a ping: what the check costs
    pool_options = {"max_creating": max_creating} if max_creating else {}

    async def phase(pool: Pool, name: str, count: int, at_once: bool) -> tuple[list[float], float]:
        acquires: list[float] = []

        async def lifecycle() -> None:
            start = time.perf_counter()
            try:
                with anyio.fail_after(op_timeout):
                    sandbox = await pool.acquire(spec)
            except Exception as exc:
                failures[name][type(exc).__name__] += 1
                acquire_failed[name] += 1
                return
            acquires.append(time.perf_counter() - start)
            try:
                if isinstance(sandbox, Ping):  # the warm check's round trip, beside the commands' in the same phase
                    mark = time.perf_counter()
                    if await sandbox.ping(min(60.0, op_timeout)):
                        pings[name].append(time.perf_counter() - mark)
                for _ in range(commands):
                    mark = time.perf_counter()
                    result = await sandbox.exec(command, timeout=min(60.0, op_timeout))
                    execs[name].append(time.perf_counter() - mark)
                    if not result.ok:
                        failures[name][f"exec {result.reason.value}"] += 1
                        break
            finally:
                await pool.close_sandbox(sandbox)

        started = time.perf_counter()
        if at_once:
            async with anyio.create_task_group() as group:
                for _ in range(count):
                    group.start_soon(lifecycle)
        else:
            for _ in range(count):
                await lifecycle()
        return acquires, time.perf_counter() - started

    async def fill(pool: Pool) -> float:
        started = time.perf_counter()
        with anyio.move_on_after(op_timeout):  # then the warm phase starts with what is ready
            while pool.warm_stats["ready"] < warm:  # noqa: ASYNC110 - the pool has no "full" event
                await anyio.sleep(0.01)
        return time.perf_counter() - started

    one_by_one = min(sandboxes, warm)  # as many as are warm: each of them a hand-over
    phases: list[tuple[str, str, int, list[float], float]] = []  # subject, name, concurrency, times, wall
    try:
        async with Pool(adapter, **pool_options) as pool:  # type: ignore[arg-type]
            times, wall = await phase(pool, "cold", sandboxes, True)
            phases.append((f"{adapter_name} cold", "cold", sandboxes, times, wall))
            times, wall = await phase(pool, "cold 1", one_by_one, False)
            phases.append((f"{adapter_name} cold", "cold 1", 1, times, wall))
        async with Pool(adapter, **pool_options) as pool:  # type: ignore[arg-type]
            pool.warm(spec, warm)
            fill_s = await fill(pool)
            ready_at_start = pool.warm_stats["ready"]
            times, wall = await phase(pool, "warm 1", one_by_one, False)
            phases.append((f"{adapter_name} warm {warm}", "warm 1", 1, times, wall))
            sequential_stats = pool.warm_stats
            refill_s = await fill(pool)
            times, wall = await phase(pool, "warm", sandboxes, True)
            phases.append((f"{adapter_name} warm {warm}", "warm", sandboxes, times, wall))
            stats = pool.warm_stats
    except BaseException:
        with anyio.CancelScope(shield=True):
            await adapter.close()
        raise
    leftovers = await close_and_count(adapter, adapter_name, adapter_options or {}, adapter.created)  # type: ignore[arg-type]

    for subject, name, concurrency, times, wall in phases:
        row = latency_row(subject, concurrency, times, wall, operation="acquire", errors=acquire_failed[name])
        row.ops_per_s = None  # latency rows: the phase's wall time says the rest
        row.extra = {"exec_p50_ms": round(percentile(execs[name], 50) * 1000, 3)} if execs[name] else {}
        if pings[name]:
            row.extra["ping_p50_ms"] = round(percentile(pings[name], 50) * 1000, 3)
        if failures[name]:
            row.extra["failures"] = dict(failures[name])
        outcome.rows.append(row)
    outcome.rows[-2].extra = {**outcome.rows[-2].extra, "fill_s": round(fill_s, 3), "ready_at_start": ready_at_start}
    outcome.rows[-2].extra.update({key: sequential_stats[key] for key in ("hits", "claimed", "misses", "dead")})
    outcome.rows[-1].extra = {**outcome.rows[-1].extra, "refill_s": round(refill_s, 3)}
    outcome.rows[-1].extra.update({key: stats[key] - sequential_stats[key] for key in ("hits", "claimed", "misses")})
    outcome.notes.append(
        f"conc {sandboxes}: {sandboxes} acquires at once; conc 1: {one_by_one} one after another. Cold: each a "
        f"create. Warm: the pool filled with {warm} first ({fill_s:.2f}s; refilled before the burst in "
        f"{refill_s:.2f}s; not in the acquire times), each taken sandbox's replacement created meanwhile. "
        f"Each sandbox runs {commands} x {command!r} and is closed"
    )
    outcome.lost = sum(count for _, _, count, _, _ in phases if count > 1) + 2 * one_by_one
    outcome.lost -= sum(len(times) for *_, times, _ in phases) + sum(acquire_failed.values())
    outcome.leaked = leftovers["leaked"]
    outcome.details.update(
        {
            "sandboxes": sandboxes,
            "warm": warm,
            "commands_per_sandbox": commands,
            "created": len(adapter.created),
            "warm_stats": stats,
            "leftovers": leftovers,
        }
    )
    return outcome

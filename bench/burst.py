"""`bench burst`: the reference system's benchmark shape.

N sandboxes are asked for at once; each, once created, runs K commands one after another
and is deleted. Every create, exec and destroy is timed and its outcome kept. Reported:
p50/p90/p95/p99 per operation, success rate, end-to-end time, commands/s; then what is
left, counted with the adapter's ``list_owned`` and ``reap`` (must be 0). ``lost``
counts sandboxes whose lifecycle produced no outcome at all (must be 0 too).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter, defaultdict

import anyio

from orchard_async import ConfigError, SandboxSpec
from orchard_async.bench.common import close_and_count, open_adapter
from orchard_async.bench.floors import DEFAULT_DOCKER_IMAGE, _docker
from orchard_async.bench.report import Row, latency_row
from orchard_async.bench.scenario import Outcome
from orchard_async.capabilities import facts_of


async def run_burst(
    adapter_name: str,
    *,
    sandboxes: int,
    commands: int,
    command: str = "true",
    adapter_options: dict | None = None,
    image: str | None = None,
    op_timeout: float = 300.0,
    max_creating: int | None = None,
    kill_apiserver: bool = False,
    abandon: float = 0.0,
) -> Outcome:
    if (adapter_options or {}).get("control_plane_only"):
        from orchard_async.bench.hollow import run_control_plane_burst  # kubemark hollow nodes: nothing to exec

        outcome = await run_control_plane_burst(
            adapter_name,
            sandboxes=sandboxes,
            adapter_options=adapter_options or {},
            image=image,
            op_timeout=op_timeout,
            kill_apiserver=kill_apiserver,
            abandon=abandon,
        )
        if commands:
            outcome.notes.append(f"--commands {commands} not run: control-plane-only sandboxes have no shell")
        return outcome
    if abandon:
        raise ConfigError("--abandon applies to control-plane-only kubernetes runs (control_plane_only)")
    if kill_apiserver:
        raise ConfigError("--kill-apiserver applies to control-plane-only kubernetes runs (control_plane_only)")
    adapter, doctor = await open_adapter(adapter_name, adapter_options)
    outcome = Outcome()
    if doctor:
        outcome.details["adapter_doctor"] = doctor
    spec = SandboxSpec(ttl=max(600.0, op_timeout * 3), image=image, labels={"orchard.bench": "burst"})
    times: dict[str, list[float]] = defaultdict(list)  # successful operations only
    failures: dict[str, Counter[str]] = defaultdict(Counter)
    fates: dict[int, str] = {}
    created: list[str] = []
    first_command_at: list[float] = []
    limiter = anyio.CapacityLimiter(max_creating) if max_creating else None

    async def timed(name: str, call: object) -> object:
        start = time.perf_counter()
        try:
            with anyio.fail_after(op_timeout):
                value = await call  # type: ignore[misc]
        except Exception as exc:
            failures[name][type(exc).__name__] += 1
            raise
        times[name].append(time.perf_counter() - start)
        return value

    async def lifecycle(index: int) -> None:
        try:
            if limiter:
                async with limiter:
                    sandbox = await timed("create", adapter.create(spec))
            else:
                sandbox = await timed("create", adapter.create(spec))
        except Exception:
            fates[index] = "create_failed"
            return
        created.append(sandbox.id)  # type: ignore[attr-defined]
        ok = True
        try:
            for _ in range(commands):
                start = time.perf_counter()
                try:
                    with anyio.move_on_after(op_timeout) as scope:
                        result = await sandbox.exec(command, timeout=min(60.0, op_timeout))  # type: ignore[attr-defined]
                except Exception as exc:
                    failures["exec"][type(exc).__name__] += 1
                    ok = False
                    break
                if scope.cancelled_caught:
                    failures["exec"]["op_timeout"] += 1
                    ok = False
                    break
                if not first_command_at:
                    first_command_at.append(time.perf_counter())
                if result.ok:
                    times["exec"].append(time.perf_counter() - start)
                else:
                    failures["exec"][result.reason.value] += 1
                    ok = False
                    if result.reason.is_infra:
                        break
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await timed("destroy", sandbox.close())  # type: ignore[union-attr]
                except Exception:
                    ok = False
        fates[index] = "ok" if ok else "failed"

    started = time.perf_counter()
    try:
        async with anyio.create_task_group() as group:
            for index in range(sandboxes):
                group.start_soon(lifecycle, index)
        wall = time.perf_counter() - started
    except BaseException:
        with anyio.CancelScope(shield=True):
            await adapter.close()
        raise
    leftovers = await close_and_count(adapter, adapter_name, adapter_options or {}, created)

    for name in ("create", "exec", "destroy"):
        failed = sum(failures[name].values())
        done = len(times[name])
        row = latency_row(adapter_name, sandboxes, times[name], wall, operation=name, errors=failed)
        row.ops = done + failed
        row.ops_per_s = row.wall_s = None  # per-operation rows give latency; throughput and time on the total row
        row.success_rate = round(done / (done + failed), 4) if done + failed else None
        if failures[name]:
            row.extra = {"failures": dict(failures[name])}
        outcome.rows.append(row)
    ok_commands = len(times["exec"])
    fate_counts = Counter(fates.values())
    outcome.rows.append(
        Row(
            subject=adapter_name,
            operation="total",
            concurrency=sandboxes,
            ops=sandboxes * commands,
            ops_per_s=round(ok_commands / wall, 1) if wall > 0 else None,
            success_rate=round(fate_counts["ok"] / sandboxes, 4),
            errors=sandboxes - fate_counts["ok"],
            wall_s=round(wall, 3),
            extra={"sandboxes_per_s": round(sandboxes / wall, 2), "commands_ok": ok_commands},
        )
    )
    if adapter_name == "docker" and commands == 0:
        parallel = max_creating or facts_of(adapter).max_creating or sandboxes
        outcome.rows.extend(await docker_run_floor(sandboxes, parallel, image or DEFAULT_DOCKER_IMAGE, op_timeout))
        outcome.notes.append(
            f"floor:docker-run: `docker run -d IMAGE sleep` then `docker rm -f` through the CLI, {parallel} at a time"
            " (the adapter's own create parallelism)"
        )
    outcome.lost = sandboxes - len(fates)
    outcome.leaked = leftovers["leaked"]
    outcome.details.update(
        {
            "sandboxes": sandboxes,
            "commands_per_sandbox": commands,
            "command": command,
            "fates": dict(fate_counts),
            "created": len(created),
            "leftovers": leftovers,
            "end_to_end_s": round(wall, 3),
            "first_command_s": round(first_command_at[0] - started, 3) if first_command_at else None,
        }
    )
    return outcome


async def docker_run_floor(count: int, parallel: int, image: str, op_timeout: float) -> list[Row]:
    """The CLI baseline for creating containers: ``docker run -d`` and ``docker rm -f``,
    ``parallel`` at a time, every one timed; each container is removed whatever happens."""
    times: dict[str, list[float]] = defaultdict(list)
    failures: Counter[str] = Counter()
    gate = anyio.Semaphore(parallel)

    async def one() -> None:
        start = time.perf_counter()  # from the request, like the adapter's rows: queueing included
        # named, so that a run whose CLI timed out (the daemon may still make the container) is removed too
        name = f"orchard-floor-{uuid.uuid4().hex[:16]}"
        async with gate:
            try:
                with anyio.fail_after(op_timeout):
                    await _docker(
                        "run",
                        "-d",
                        "--network",
                        "none",
                        "--name",
                        name,
                        "--label",
                        "orchard.bench=floor",
                        image,
                        "sleep",
                        "600",
                    )
            except Exception as exc:
                failures[type(exc).__name__] += 1
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await _docker("rm", "-f", name)
                return
            times["create"].append(time.perf_counter() - start)
            start = time.perf_counter()
            with anyio.CancelScope(shield=True):
                await _docker("rm", "-f", name)
            times["destroy"].append(time.perf_counter() - start)

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(count):
            group.start_soon(one)
    wall = time.perf_counter() - started
    rows = []
    for name in ("create", "destroy"):
        row = latency_row(
            "floor:docker-run",
            count,
            times[name],
            wall,
            operation=name,
            errors=sum(failures.values()) if name == "create" else 0,
        )
        row.ops_per_s, row.wall_s = None, None
        rows.append(row)
    rows.append(
        Row(
            subject="floor:docker-run",
            operation="total",
            concurrency=count,
            ops=count,
            success_rate=round(len(times["create"]) / count, 4),
            wall_s=round(wall, 3),
            extra={"sandboxes_per_s": round(len(times["destroy"]) / wall, 2)},
        )
    )
    return rows

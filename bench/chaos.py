"""`bench chaos`: runs that go wrong, and what they leave behind.

* ``--adapter sim``: a rollout with injected faults (create failures, sandboxes that die
  mid-episode, commands that hang until their timeout, a backend outage). Every planned
  episode must come out finished or failed with a reason: ``lost`` (no record) and
  duplicates must be 0, and nothing may be left after ``reap``.
* any other adapter (``local``, ``docker``, ...): a controller process runs a rollout into
  a trajectory file and is SIGKILLed mid-way. Leftovers are counted at once, after the
  sandboxes' own self-destruct had a moment, and after ``reap``; then the run is resumed
  from its file and must complete exactly the missing episodes (``lost`` 0), and the
  count after reap plus what the resumed run left is ``leaked`` (must be 0).

Counting leftovers *before* reap needs a look at the backend from outside; that is a
small per-adapter probe (``PROBES``). An adapter without one still gets the reap and
resume checks, with a note.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

from orchard_async import EndReason, Pool, SandboxSpec, collect, get_adapter, read_trajectories, rollout
from orchard_async.bench.common import TrackingAdapter, close_and_count, open_adapter
from orchard_async.bench.report import Row
from orchard_async.bench.scenario import Outcome
from orchard_async.bench.tasks import RepeatPolicy, steps_tasks
from orchard_async.kit import procfs

SIM_FAULTS: dict[str, Any] = {
    "seed": 7,
    "create_latency": {"kind": "exp", "a": 0.005},
    "exec_latency": {"kind": "exp", "a": 0.002},
    "destroy_latency": {"kind": "exp", "a": 0.002},
    "create_failure_rate": 0.1,
    "death_rate": 0.01,
    "exec_hang_rate": 0.01,
    "outage": [100, 160],
}


async def chaos_sim(
    *, episodes: int, concurrency: int, steps: int = 10, adapter_options: dict | None = None, max_retries: int = 2
) -> Outcome:
    options = {**SIM_FAULTS, **(adapter_options or {})}
    inner, _ = await open_adapter("sim", options)
    adapter = TrackingAdapter(inner)
    pool = Pool(adapter, max_backoff=1.0)  # the engine's backoff, bounded so the scenario takes seconds
    spec = SandboxSpec(ttl=600)
    tasks = steps_tasks(8, steps=steps, spec=spec, exec_timeout=0.2, deadline=60.0, score_timeout=5.0)
    seen: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    retries: Counter[str] = Counter()
    command_reasons: Counter[str] = Counter()
    started = time.perf_counter()
    try:
        stream = rollout(tasks, RepeatPolicy(), pool, n=episodes, concurrency=concurrency, max_retries=max_retries)
        async with contextlib.aclosing(stream):
            async for trajectory in stream:
                seen[trajectory.episode_id] += 1
                statuses[trajectory.status] += 1
                if trajectory.status == "failed":
                    ends[trajectory.end_reason] += 1
                for retry in trajectory.retries:
                    retries[retry.reason] += 1
                for step in trajectory.steps:
                    if step.reason:
                        command_reasons[step.reason] += 1
        wall = time.perf_counter() - started
    except BaseException:
        with anyio.CancelScope(shield=True):
            await adapter.close()
        raise
    leftovers = await close_and_count(adapter, "sim", options, adapter.created)
    lost = episodes - len(seen)
    duplicates = sum(count - 1 for count in seen.values())
    outcome = Outcome(lost=lost + duplicates, leaked=leftovers["leaked"])
    subject = "sim"

    def row(operation: str, count: int, **fields: Any) -> None:
        outcome.rows.append(Row(subject=subject, concurrency=concurrency, operation=operation, count=count, **fields))

    row("planned", episodes, wall_s=round(wall, 3), episodes_per_s=round(len(seen) / wall, 1) if wall else None)
    faults = {
        "creates_attempted": inner.creates,
        "creates_failed": inner.creates - inner.created,
        "sandboxes_died": retries.get(EndReason.SANDBOX_LOST, 0) + ends.get(EndReason.SANDBOX_LOST, 0),
        "commands_timed_out": command_reasons.get("timeout", 0),
    }
    row("injected: failed creates (incl. outage)", faults["creates_failed"])
    row("injected: sandboxes died mid-episode", faults["sandboxes_died"])
    row("injected: hung commands (timed out)", faults["commands_timed_out"])
    row("infrastructure retries", sum(retries.values()))
    row("finished", statuses["finished"], success_rate=round(statuses["finished"] / episodes, 4))
    for reason, count in sorted(ends.items()):
        row(f"failed: {reason}", count)
    row("lost", lost)
    row("duplicated", duplicates)
    outcome.details.update(
        {
            "planned": episodes,
            "finished": statuses["finished"],
            "failed": dict(ends),
            "lost": lost,
            "duplicated": duplicates,
            "retries": dict(retries),
            "command_reasons": dict(command_reasons),
            "faults": faults,
            "sim_config": options,
            "leftovers": leftovers,
        }
    )
    outcome.notes.append(
        "injected: "
        + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in faults.items())
        + f"; infra retries {sum(retries.values())}"
    )
    return outcome


# -- a SIGKILLed controller --------------------------------------------------------------


class Probe:
    """Counts a backend's sandboxes of one chaos run from outside the controller."""

    def prepare(self, options: dict[str, Any], workdir: Path) -> dict[str, Any]:
        return options

    async def count(self, label: str) -> dict[str, int] | None:
        return None


class LocalProbe(Probe):
    """Sandbox dirs under a private root, and live processes of sandboxes rooted there."""

    def prepare(self, options: dict[str, Any], workdir: Path) -> dict[str, Any]:
        if "root" not in options:
            options = {**options, "root": str(workdir / "sandboxes")}
        self.root = Path(options["root"])
        return options

    async def count(self, label: str) -> dict[str, int]:
        return await anyio.to_thread.run_sync(self._count)

    def _count(self) -> dict[str, int]:
        dirs = [p for p in self.root.iterdir() if p.is_dir()] if self.root.exists() else []
        # Every process of a local sandbox inherits variables pointing into its directory
        # (HOME, the adapter's sandbox variable): match on the value, not a variable's name.
        marker = b"=" + str(self.root).encode() + b"/"
        processes = sum(marker in environ for pid, environ in procfs.environs() if pid != os.getpid())
        return {"sandboxes": len(dirs), "processes": processes}


class DockerProbe(Probe):
    """Containers carrying this run's ``orchard.bench`` label (the spec's labels), and how
    many are in each of docker's states (``state:running``, ``state:removing``, ...): a
    container still there may hold processes, or be only the daemon's removal under way."""

    async def count(self, label: str) -> dict[str, int] | None:
        if shutil.which("docker") is None:
            return None
        process = await asyncio.create_subprocess_exec(
            "docker",
            "ps",
            "-a",
            "--filter",
            f"label=orchard.bench={label}",
            "--format",
            "{{.State}}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        with anyio.fail_after(60):
            out, _ = await process.communicate()
        states = out.decode().split()
        return {"sandboxes": len(states), **{f"state:{state}": n for state, n in Counter(states).items()}}


class KubernetesProbe(Probe):
    """Pods carrying this run's ``orchard.bench`` label, ended or being deleted included: a
    pod counts until the API server no longer has it."""

    def prepare(self, options: dict[str, Any], workdir: Path) -> dict[str, Any]:
        self.options = options
        return options

    async def count(self, label: str) -> dict[str, int] | None:
        from orchard_async.adapters.kubernetes import KubernetesAdapter  # the kubernetes extra, only here

        adapter = KubernetesAdapter(**self.options)
        try:
            with anyio.fail_after(60):
                pods = await adapter.find_sandboxes({"orchard.bench": label})
        finally:
            await adapter.close()
        return {"sandboxes": len(pods)}


PROBES: dict[str, type[Probe]] = {"local": LocalProbe, "docker": DockerProbe, "kubernetes": KubernetesProbe}

# Seconds after its controller's SIGKILL by which the README promises a sandbox is gone by
# itself: `--settle`'s default, so that "left after self-destruct" checks the promise.
PROMISED_SELF_DESTRUCT: dict[str, float] = {"local": 2.0, "docker": 6.0, "kubernetes": 15.0}


def _total(counts: dict[str, int] | None) -> int:
    return counts.get("sandboxes", 0) + counts.get("processes", 0) if counts else 0


def _records(path: Path) -> int:
    try:
        data = path.read_bytes()
    except OSError:
        return 0
    return data.count(b"\n") - data.startswith(b'{"orchard_run":')  # the run header is no episode


async def _kill_round(
    argv: list[str], out: Path, kill_at: int, episodes: int, concurrency: int, probe: Probe, label: str, log: int
) -> tuple[int, dict[str, Any], float]:
    """Start a controller (it resumes the run from ``out``), wait until the file has
    ``kill_at`` episodes and the sandboxes are live, SIGKILL it. Returns records at the kill,
    the probe's count then, and the kill's time (perf_counter)."""
    process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL, stderr=log)
    try:
        with anyio.move_on_after(120) as wait:
            while _records(out) < kill_at and process.returncode is None:  # noqa: ASYNC110 - polls a file another process writes
                await anyio.sleep(0.02)
            # Kill while the controller holds its full complement of sandboxes, when we can see it.
            with anyio.move_on_after(2):
                while process.returncode is None:
                    counts = await probe.count(label)
                    wanted = min(concurrency, episodes - _records(out))
                    if counts is None or counts.get("sandboxes", 0) >= wanted:
                        break
                    await anyio.sleep(0.01)
        if process.returncode is not None:
            raise RuntimeError(f"the controller ended before it was killed (exit {process.returncode})")
        if wait.cancelled_caught:
            raise RuntimeError(f"the controller wrote fewer than {kill_at} episodes in 120 s")
        done = _records(out)
        process.kill()  # SIGKILL to our own child, by its handle
        killed_at = time.perf_counter()
        await process.wait()
        return done, {"at_kill": await probe.count(label)}, killed_at
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def chaos_kill(
    adapter_name: str,
    *,
    episodes: int,
    concurrency: int,
    steps: int = 6,
    command: str = "sleep 0.2",
    adapter_options: dict | None = None,
    image: str | None = None,
    settle: float | None = None,
    rounds: int = 3,
) -> Outcome:
    """``rounds`` times: a controller resumes the run and is SIGKILLed mid-way; count what
    its sandboxes left at the kill, after their self-destruct had ``settle`` seconds (default:
    PROMISED_SELF_DESTRUCT, else 10), after ``reap``. Then the run is resumed in this process
    to the end."""
    if settle is None:
        settle = PROMISED_SELF_DESTRUCT.get(adapter_name, 10.0)
    outcome = Outcome()
    workdir = Path(tempfile.mkdtemp(prefix="orchard-bench-chaos-"))
    probe = PROBES.get(adapter_name, Probe)()
    options = probe.prepare(dict(adapter_options or {}), workdir)
    adapter, doctor = await open_adapter(adapter_name, options)  # fail early if the backend is not there
    await adapter.close()
    label = uuid.uuid4().hex[:12]
    out = workdir / "trajectories.jsonl"
    argv = [sys.executable, "-m", "orchard_async.bench._child", "controller", "--adapter", adapter_name]
    argv += ["--adapter-options", json.dumps(options), "--out", str(out), "--label", label]
    argv += [
        "--episodes",
        str(episodes),
        "--concurrency",
        str(concurrency),
        "--steps",
        str(steps),
        "--command",
        command,
    ]
    if image:
        argv += ["--image", image]
    log = os.open(workdir / "controller.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    kills: list[dict[str, Any]] = []
    try:
        for index in range(rounds):
            kill_at = max(index + 1, episodes * (index + 1) // (rounds + 1))
            try:
                done, counts, killed_at = await _kill_round(
                    argv, out, kill_at, episodes, concurrency, probe, label, log
                )
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}; see {workdir / 'controller.log'}") from None
            counts["after_settle"] = counts["at_kill"]
            settled_in = None
            if counts["at_kill"] is not None:
                with anyio.move_on_after(settle - (time.perf_counter() - killed_at)):
                    while _total(counts["after_settle"]):  # noqa: ASYNC110 - the backend is polled
                        await anyio.sleep(0.05)
                        counts["after_settle"] = await probe.count(label)
                if not _total(counts["after_settle"]):
                    settled_in = round(time.perf_counter() - killed_at, 3)
            reaper = get_adapter(adapter_name, **options)
            try:
                reaped = await reaper.reap(0.0)
            finally:
                await reaper.close()
            counts["after_reap"] = await probe.count(label)
            kills.append({"records_at_kill": done, **counts, "self_destruct_s": settled_in, "reaped": len(reaped)})

        # Resume the killed run from its file: exactly the missing episodes must run.
        resumed_adapter = TrackingAdapter(get_adapter(adapter_name, **options))
        spec = SandboxSpec(ttl=600, image=image, labels={"orchard.bench": label})
        tasks = steps_tasks(4, steps=steps, command=command, spec=spec, exec_timeout=30.0, deadline=300.0)
        try:
            summary = await collect(
                tasks, RepeatPolicy(), resumed_adapter, out, resume=True, n=episodes, concurrency=concurrency
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await resumed_adapter.close()
            raise
        final = await close_and_count(resumed_adapter, adapter_name, options, resumed_adapter.created)
        after_resume = await probe.count(label)
    finally:
        os.close(log)
    ids = Counter(t.episode_id for t in read_trajectories(out))
    lost = episodes - len(ids)
    duplicates = sum(c - 1 for c in ids.values())
    outcome.lost = lost + duplicates
    left_after_reap = sum(_total(kill["after_reap"]) for kill in kills)
    outcome.leaked = left_after_reap + final["leaked"] + _total(after_resume)
    subject = f"{adapter_name}:sigkill"
    probed = kills[0]["at_kill"] is not None

    def row(operation: str, count: int | None) -> None:
        outcome.rows.append(Row(subject=subject, concurrency=concurrency, operation=operation, count=count))

    def total(stage: str, what: str = "sandboxes") -> int | None:
        return sum((kill[stage] or {}).get(what, 0) for kill in kills) if probed else None

    row("episodes planned", episodes)
    row("controllers SIGKILLed", len(kills))
    row("sandboxes live at the kills", total("at_kill"))
    if probed and "processes" in kills[0]["at_kill"]:
        row("their processes just after the kills", total("at_kill", "processes"))
    row(
        f"left after self-destruct ({settle:g} s max)",
        sum(_total(k["after_settle"]) for k in kills) if probed else None,
    )
    row("removed by reap", sum(kill["reaped"] for kill in kills))
    row("left after reap", left_after_reap if probed else None)
    row("episodes recorded before the last kill", kills[-1]["records_at_kill"])
    row("episodes run by the final --resume", summary.written)
    row("lost", lost)
    row("duplicated", duplicates)
    outcome.details.update(
        {
            "planned": episodes,
            "kills": kills,
            "resumed": summary.written,
            "skipped_on_resume": summary.skipped,
            "after_resumed_run": final,
            "after_resume_probe": after_resume,
            "lost": lost,
            "duplicated": duplicates,
            "workdir": str(workdir),
        }
    )
    if doctor:
        outcome.details["adapter_doctor"] = doctor
    if not probed:
        outcome.notes.append(
            f"no leftover probe for the {adapter_name} adapter (bench/chaos.py PROBES): counted by reap only"
        )
    else:
        times = [kill["self_destruct_s"] for kill in kills]
        if all(t is not None for t in times):
            outcome.notes.append(
                f"after each SIGKILL every sandbox of the dead controller was gone by itself, before any reap, "
                f"within {max(times):.2f} s"
            )
        else:
            outcome.notes.append(
                f"after {sum(t is None for t in times)} of {len(times)} kills some sandboxes were still there "
                f"{settle:g} s later: removed by reap, or counted as leaked"
            )
    if outcome.lost == 0 and outcome.leaked == 0:
        shutil.rmtree(workdir, ignore_errors=True)
    return outcome

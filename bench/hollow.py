"""`bench burst --adapter kubernetes` in control-plane-only mode (``control_plane_only``:
kubemark hollow nodes, scripts/k8s-hollow-nodes.sh): N sandboxes asked for at once, every
one waited to Running, then all deleted. Nothing is exec'd, so every row is labelled
``kubernetes[control-plane-only]`` and never mixes with exec numbers.

Reported: creates/s and time to all-ready, deletes/s, API requests per sandbox by verb
(the adapter's own counters), watch events and relists, the controller's CPU and RSS, the
control plane's CPU by process (API server, etcd, scheduler, controller-manager, hollow
nodes: from the PIDs the cluster scripts record in ORCHARD_K8S_WORK), pods left after the
deletes and after close and reap (must be 0). ``--kill-apiserver`` stops the API server
once half the creates are done and starts it again: the watch must recover, no sandbox may
be created twice (the run's pods, listed once all creates returned, number the creates that
succeeded) and nothing may be left.

``abandon`` (a share, 0-1) tests reap at scale: that share of the sandboxes is not closed but
forgotten, as a controller that crashed would leave them (the pods are annotated with a
controller process that has exited: ``dead_controller``), and a fresh adapter's ``reap`` must
find and delete every one of them, listing page by page: its wall time, deletes/s, list pages and peak Python memory (tracemalloc, the reap call
only) are reported, and ``left_after_reap`` counts the run's pods still listed after it.
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

from orchard_async import ConfigError, SandboxSpec, get_adapter
from orchard_async.bench.common import close_and_count, open_adapter, peak_rss_mb
from orchard_async.bench.report import Row, latency_row
from orchard_async.bench.scenario import Outcome
from orchard_async.kit import labels as names
from orchard_async.kit import procfs

SUBJECT = "kubernetes[control-plane-only]"
CLUSTER_PROCESSES = ("apiserver", "etcd", "sched", "kcm")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (None when it is gone)."""
    times = procfs.cpu_seconds(pid)
    return None if times is None else times[0]


def cluster_pids() -> dict[str, list[int]]:
    """The cluster's processes by role, from the pid files of scripts/k8s-cluster-up.sh and
    scripts/k8s-hollow-nodes.sh (empty outside `ci-kubernetes.sh run`)."""
    work = os.environ.get("ORCHARD_K8S_WORK")
    if not work:
        return {}
    found: dict[str, list[int]] = {}
    for role in CLUSTER_PROCESSES:
        with_pid = Path(work, f"{role}.pid")
        if with_pid.exists():
            found[role] = [int(with_pid.read_text())]
    found["hollow_nodes"] = [int(p.read_text()) for p in Path(work, "hollow").glob("*.pid")]
    return found


class CpuMeter:
    """CPU seconds used between ``start`` and ``stop`` by this process and each cluster role.
    A process replaced in between (the API server restarted) is counted up to ``cut``."""

    def __init__(self) -> None:
        self.used: Counter[str] = Counter()
        self._start: dict[tuple[str, int], float] = {}
        self._self0 = 0.0

    @staticmethod
    def _self() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def start(self) -> None:
        self._self0 = self._self()
        self._mark()

    def _mark(self) -> None:
        for role, pids in cluster_pids().items():
            for pid in pids:
                if (role, pid) not in self._start and (cpu := process_cpu_s(pid)) is not None:
                    self._start[role, pid] = cpu

    def cut(self, role: str) -> None:
        """Count ``role``'s processes now (before they are stopped); their successors start at 0."""
        for (name, pid), cpu0 in list(self._start.items()):
            if name == role and (cpu := process_cpu_s(pid)) is not None:
                self.used[role] += cpu - cpu0
                del self._start[name, pid]

    def restarted(self, role: str) -> None:
        for pid in cluster_pids().get(role, []):
            self._start.setdefault((role, pid), 0.0)

    def stop(self) -> dict[str, float]:
        for (role, pid), cpu0 in self._start.items():
            if (cpu := process_cpu_s(pid)) is not None:
                self.used[role] += cpu - cpu0
        self.used["controller"] += self._self() - self._self0
        return {role: round(seconds, 1) for role, seconds in self.used.items()}


def apiserver(action: str) -> None:
    scripts = os.environ.get("ORCHARD_K8S_SCRIPTS")
    if not scripts:
        raise ConfigError("--kill-apiserver needs the cluster of scripts/ci-kubernetes.sh run (ORCHARD_K8S_SCRIPTS)")
    subprocess.run(["bash", f"{scripts}/k8s-cluster-up.sh", f"apiserver-{action}"], check=True, timeout=180)


async def run_control_plane_burst(
    adapter_name: str,
    *,
    sandboxes: int,
    adapter_options: dict[str, Any],
    image: str | None = None,
    op_timeout: float = 300.0,
    kill_apiserver: bool = False,
    abandon: float = 0.0,
) -> Outcome:
    if not 0.0 <= abandon < 1.0:
        raise ConfigError(f"--abandon is the share of sandboxes left for reap: 0 <= share < 1, not {abandon}")
    adapter, doctor = await open_adapter(adapter_name, adapter_options)
    if abandon:
        # every pod names a controller that has exited (this process lives on and closes the
        # rest itself): the abandoned share is then, to a fresh reap, a crashed run's
        adapter.identity = dead_controller()  # type: ignore[attr-defined]
    outcome = Outcome(notes=[f"{SUBJECT}: pods reach Running on kubemark hollow nodes; nothing is exec'd"])
    outcome.details["mode"] = "control-plane-only"
    if doctor:
        outcome.details["adapter_doctor"] = doctor
    spec = SandboxSpec(ttl=max(600.0, op_timeout * 3), image=image, labels={"orchard.bench": "burst"})
    created: dict[int, Any] = {}
    times: dict[str, list[float]] = {"create": [], "delete": []}
    failures: dict[str, Counter[str]] = {"create": Counter(), "delete": Counter()}
    half = anyio.Event()
    meter = CpuMeter()
    kill: dict[str, float] = {}
    samples: list[str] = []  # the first create failures' messages

    async def create(index: int) -> None:
        start = time.perf_counter()
        try:
            with anyio.fail_after(op_timeout):
                created[index] = await adapter.create(spec)
        except Exception as exc:
            failures["create"][type(exc).__name__] += 1
            if len(samples) < 5:
                samples.append(f"{type(exc).__name__}: {exc}"[:400])
            return
        finally:
            if len(created) + sum(failures["create"].values()) >= sandboxes // 2:
                half.set()
        times["create"].append(time.perf_counter() - start)

    async def delete(sandbox: Any) -> None:
        start = time.perf_counter()
        try:
            with anyio.fail_after(op_timeout):
                await sandbox.close()
        except Exception as exc:
            failures["delete"][type(exc).__name__] += 1
            return
        times["delete"].append(time.perf_counter() - start)

    async def kill_midway() -> None:
        await half.wait()
        meter.cut("apiserver")
        t = time.perf_counter()
        await anyio.to_thread.run_sync(apiserver, "stop")
        await anyio.sleep(2.0)  # down long enough for the watch and the creates to notice
        await anyio.to_thread.run_sync(apiserver, "start")
        meter.restarted("apiserver")
        kill["down_s"] = round(time.perf_counter() - t, 1)

    meter.start()
    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        if kill_apiserver:
            group.start_soon(kill_midway)
        for index in range(sandboxes):
            group.start_soon(create, index)
    all_ready = time.perf_counter() - started
    pods_listed = await _count_run_pods(adapter)
    stats_after_create = dict(adapter.stats)  # type: ignore[attr-defined]
    to_close = list(created.values())
    abandoned = {sandbox.id for sandbox in to_close[: int(len(to_close) * abandon)]}
    to_close = [sandbox for sandbox in to_close if sandbox.id not in abandoned]
    for name in abandoned:  # what a crashed controller leaves: pods it no longer knows of
        adapter._live.pop(name, None)  # type: ignore[attr-defined]
    deleting = time.perf_counter()
    async with anyio.create_task_group() as group:
        for sandbox in to_close:
            group.start_soon(delete, sandbox)
    delete_wall = time.perf_counter() - deleting
    left_after_delete = await _count_run_pods(adapter) - len(abandoned)
    informer = adapter.informer  # type: ignore[attr-defined]
    watch = {
        "events": informer.events,
        "relists": informer.lists - 1,
        "watch_connects": informer.watches,
        "watch_errors": informer.errors,
        "gone_410": informer.gone_410,
    }
    stats = dict(adapter.stats)  # type: ignore[attr-defined]
    cpu = meter.stop()
    wall = time.perf_counter() - started
    rss = peak_rss_mb()
    ids = [sandbox.id for sandbox in created.values()]
    reap = await _reap_abandoned(adapter, adapter_name, adapter_options, abandoned) if abandoned else None
    leftovers = await close_and_count(adapter, adapter_name, adapter_options, ids)

    ok_creates, ok_deletes = len(times["create"]), len(times["delete"])
    for name, wall_s in (("create", all_ready), ("delete", delete_wall)):
        row = latency_row(SUBJECT, sandboxes, times[name], wall_s, operation=name, errors=sum(failures[name].values()))
        row.ops_per_s = round(len(times[name]) / wall_s, 1) if wall_s > 0 else None
        row.wall_s = round(wall_s, 2)
        if failures[name]:
            row.extra = {"failures": dict(failures[name])}
        outcome.rows.append(row)
    per_sandbox = {
        key.removeprefix("api_"): round(value / sandboxes, 2)
        for key, value in sorted(stats.items())
        if key.startswith("api_") and key not in ("api_calls", "api_retries")
    }
    outcome.rows.append(
        Row(
            subject=SUBJECT,
            operation="total",
            concurrency=sandboxes,
            ops=sandboxes,
            success_rate=round(min(ok_creates, ok_deletes + len(abandoned)) / sandboxes, 4),
            errors=sandboxes - min(ok_creates, ok_deletes + len(abandoned)),
            wall_s=round(wall, 2),
            peak_rss_mb=rss,
            extra={
                "api_requests_per_sandbox": per_sandbox,
                "api_retries": stats.get("api_retries", 0),
                "watch": watch,
                "cpu_s": cpu,
                "controller_cpu_share": round(cpu.get("controller", 0) / max(sum(cpu.values()), 1e-9), 3),
            },
        )
    )
    outcome.lost = sandboxes - ok_creates - sum(failures["create"].values())
    outcome.leaked = leftovers["leaked"] + left_after_delete + (reap["left_after_reap"] if reap else 0)
    outcome.details.update(
        {
            "sandboxes": sandboxes,
            "created": ok_creates,
            "time_to_all_ready_s": round(all_ready, 2),
            "creates_per_s": round(ok_creates / all_ready, 1) if all_ready > 0 else None,
            "deletes_per_s": round(ok_deletes / delete_wall, 1) if delete_wall > 0 else None,
            "closed": len(to_close),
            "abandoned_for_reap": len(abandoned),
            "pods_listed_after_creates": pods_listed,  # == created: none made twice, none extra
            "left_after_delete": left_after_delete,
            "create_failures": samples,
            "leftovers": leftovers,
            "api_requests": stats,
            "api_requests_during_creates": stats_after_create,
            "watch": watch,
            "cpu_s": cpu,
            "controller_peak_rss_mb": rss,
        }
    )
    if reap:
        outcome.details["reap"] = reap
    if kill_apiserver:
        outcome.details["apiserver_kill"] = {**kill, "at": "after half the creates"}
    return outcome


async def _count_run_pods(adapter: Any) -> int:
    """This run's pods as the API server lists them (paginated), terminating ones included."""
    selector = f"{names.RUN}={adapter.run_id}"
    return len(await adapter.api.list_all(adapter.api.path("pods"), selector, "bench pod count"))


def dead_controller() -> dict[str, str]:
    """The identity (``labels.controller_identity``) of a process that has exited: pods
    annotated with it are, to reap, a crashed controller's (reap deletes a pod whose
    controller is dead, one that ended, or one past its TTL; hollow pods never end and the
    TTLs are long). A child is started, its identity read, and it is waited for."""
    child = subprocess.Popen(["sleep", "0.2"])
    try:
        identity = {
            **names.controller_identity(),
            "pid": str(child.pid),
            "start": procfs.start_ticks(child.pid) or "",
        }
    finally:
        child.wait()
    if procfs.start_ticks(child.pid) == identity["start"] or not identity["start"]:
        raise RuntimeError("could not make a dead controller's identity (the child's start time was not read)")
    return identity


async def _reap_abandoned(
    adapter: Any, adapter_name: str, options: dict[str, Any], abandoned: set[str]
) -> dict[str, Any]:
    """A fresh adapter's reap (another controller's, as the next run's would be) must delete
    every abandoned pod: their controller is dead (``dead_controller``) and nobody holds them. Its Python memory is traced for the reap call alone: it lists
    page by page keeping names, so its peak stays near one page whatever the namespace holds."""
    reaper = get_adapter(adapter_name, **options)
    try:
        tracemalloc.start()
        started = time.perf_counter()
        reaped = set(await reaper.reap(0.0))
        wall = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        stats = dict(reaper.stats)  # type: ignore[attr-defined]
        selector = f"{names.RUN}={adapter.run_id}"
        still = [
            pod["metadata"]["name"]
            for pod in await reaper.api.list_all(reaper.api.path("pods"), selector, "pods left after reap")  # type: ignore[attr-defined]
            if not pod["metadata"].get("deletionTimestamp")
        ]
    finally:
        await reaper.close()
    return {
        "abandoned": len(abandoned),
        "reaped": len(reaped & abandoned),
        "reaped_not_abandoned": len(reaped - abandoned),
        "wall_s": round(wall, 2),
        "deletes_per_s": round(len(reaped) / wall, 1) if wall > 0 else None,
        "list_pages": stats.get("api_GET", 0),  # the reap's GETs are its list pages (500 pods each)
        "peak_traced_mb": round(peak / 2**20, 1),
        "left_after_reap": len(set(still) & abandoned),  # not deleted (terminating ones are deleted)
    }

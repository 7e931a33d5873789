"""CPU-seconds per docker SWE episode, by who spends them (issue 15).

    python -m orchard_async.bench.episode_cpu --episodes 64 --concurrency 16 --group-size 8 [--fork] [--warm]
    python -m orchard_async.bench.episode_cpu --pytest-split   # the scorer's test run, taken apart

On 2 cores episodes/s is bounded by the CPU one episode costs, wherever it is spent. A rollout
of the SWE recipe (oracle policy) runs through the real engine on the docker adapter, and:

* our controller: ``getrusage`` of this process (self; children are the host's ``git``);
* ``dockerd`` and ``containerd``: their ``/proc/<pid>/stat`` before and after the run (the
  daemons are shared: another user's containers in the same seconds count here too);
* each of our containers' ``containerd-shim``: its own CPU (it copies the exec and attach
  streams) and its reaped children's before the container is removed (the ``runc`` runs for
  create, start and the shell exec; the removal's ``runc kill``/``delete`` are not seen);
* inside each container: its cgroup's CPU, read before and after every command (so each
  command's own cost, by what it is: checkout, agent, submission, staging, tests...) and at
  removal (the rest is the sandbox's bootstrap and its idle shell: relays, keepalive);
* the whole machine (``/proc/stat``), so what nobody above accounts for (other users, the
  kernel's own work) shows as the remainder.

``--pytest-split`` runs, in one container per bundled repository, the scorer's test command
and its parts (interpreter start, ``import pytest``, collection) a few times each and reports
their CPU from the container's cgroup: the tests' own time is the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import anyio

from orchard_async import Pool, load_recipe, rollout, summarize
from orchard_async.adapters.docker import DockerAdapter
from orchard_async.bench.common import ForkingTrackingAdapter, TrackingAdapter
from orchard_async.kit import procfs

SAMPLE_EVERY = 0.2  # seconds between looks at the shims (they go with their container)

# What a command is, by a piece of its script (the recipe's own scripts; the oracle's commands).
PHASES = (
    ("checkout", "git init -q --template="),
    ("proof", "orchard-harness-proof"),
    ("history", "orchard-kept"),  # repo.drop_history: the agent's repository cut to its tree
    ("agent", "ORCHARD_PATCH"),
    ("agent", "git diff --stat"),
    ("submission", "add -A -- ."),
    ("stage", "@@ORCHARD_STAGE="),
    ("tests", "short test summary info"),
    ("log_tail", "tail -c 3000"),
    ("health", "true"),
)


def phase_of(command: str) -> str:
    for phase, marker in PHASES:
        if marker == command if phase == "health" else marker in command:
            return phase
    return "other"


# -- reading CPU ---------------------------------------------------------------------------


def pids_named(name: str, parent: int | None = None) -> list[int]:
    """Processes called ``name`` (children of ``parent`` only, when given)."""
    return [
        pid for pid in procfs.pids() if procfs.comm(pid) == name and (parent is None or procfs.parent(pid) == parent)
    ]


def cgroup_usage_file(container_id: str) -> str | None:
    """The file with the container's CPU in ns (v1 cpuacct) or its cpu.stat (v2)."""
    for path in (
        f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage",
        f"/sys/fs/cgroup/cpu,cpuacct/docker/{container_id}/cpuacct.usage",
        f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/cpu.stat",
        f"/sys/fs/cgroup/docker/{container_id}/cpu.stat",
    ):
        if os.path.exists(path):
            return path
    return None


def cgroup_seconds(path: str | None) -> float | None:
    if path is None:
        return None
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        return None
    if path.endswith("cpuacct.usage"):
        return int(text) / 1e9
    for line in text.splitlines():
        if line.startswith("usage_usec"):
            return int(line.split()[1]) / 1e6
    return None


class ShimWatch:
    """Our containers' shims, looked at every SAMPLE_EVERY s in a thread (they exit with
    their container): the last own and children's CPU seen for each."""

    def __init__(self) -> None:
        self.by_container: dict[str, int] = {}
        self.last: dict[str, tuple[float, float]] = {}
        self.ended: set[str] = set()
        self._seen: set[int] = set()
        self.cpu = 0.0  # what looking cost this process (taken out of the controller's CPU)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def look(self) -> None:
        mark = time.thread_time()
        try:
            self._look()
        finally:
            self.cpu += time.thread_time() - mark

    def _look(self) -> None:
        # Each new pid's name is read once: reading every process's comm each time cost more
        # CPU than the shims spend.
        # (pids are reused: one gone from /proc is forgotten, and read again when it is back)
        present = set(procfs.pids())
        self._seen &= present
        for pid in present - self._seen:
            self._seen.add(pid)
            if procfs.comm(pid) != "containerd-shim":
                continue
            argv = procfs.cmdline(pid) or []
            try:
                self.by_container[argv[argv.index(b"-id") + 1].decode()] = pid
            except (ValueError, IndexError):
                pass
        for container_id, pid in list(self.by_container.items()):
            if container_id in self.ended:
                continue
            times = procfs.cpu_seconds(pid)
            if times is None:
                self.ended.add(container_id)
            else:
                self.last[container_id] = times

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            self.look()


# -- the adapter, counting ---------------------------------------------------------------------


class Account:
    """What one run's sandboxes spent."""

    def __init__(self) -> None:
        self.commands: Counter[str] = Counter()  # phase -> count
        self.command_cpu: defaultdict[str, float] = defaultdict(float)  # (kind/phase) -> s
        self.sandbox_cpu: defaultdict[str, float] = defaultdict(float)  # kind -> whole cgroup s
        self.sandboxes: Counter[str] = Counter()
        self.runc_before_close = 0.0
        self.unread = 0  # sandboxes whose cgroup could not be read


class CountingDocker(DockerAdapter):
    """The docker adapter, remembering each sandbox's container id (for its cgroup)."""

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.container_ids: dict[str, str] = {}

    def _sandbox(self, container, name, *args, **kwargs):  # type: ignore[override]
        self.container_ids[name] = container.id
        return super()._sandbox(container, name, *args, **kwargs)


class MeteredSandbox:
    """A sandbox whose commands are metered by its container's cgroup."""

    def __init__(self, inner: Any, cgroup: str | None, account: Account, shims: ShimWatch, container_id: str):
        self._inner, self._cgroup, self._account = inner, cgroup, account
        self._shims, self._container_id = shims, container_id
        self.phases: Counter[str] = Counter()
        self.spent: defaultdict[str, float] = defaultdict(float)
        self.snapshotted = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def labels(self) -> dict[str, str]:
        return self._inner.labels

    @labels.setter
    def labels(self, value: dict[str, str]) -> None:
        self._inner.labels = value

    async def exec(self, cmd: str, **kwargs: Any) -> Any:
        before = cgroup_seconds(self._cgroup)
        result = await self._inner.exec(cmd, **kwargs)
        after = cgroup_seconds(self._cgroup)
        phase = phase_of(cmd)
        self.phases[phase] += 1
        if before is not None and after is not None:
            self.spent[phase] += after - before
        return result

    def kind(self) -> str:
        if self.snapshotted:
            return "group base"
        if self.phases["stage"]:
            return "scorer"
        return "agent"

    async def close(self) -> None:
        total = cgroup_seconds(self._cgroup)
        self._shims.look()
        pid = self._shims.by_container.get(self._container_id)
        times = procfs.cpu_seconds(pid) if pid else None
        await self._inner.close()
        kind = self.kind()
        account = self._account
        account.sandboxes[kind] += 1
        for phase, count in self.phases.items():
            account.commands[f"{kind}/{phase}"] += count
            account.command_cpu[f"{kind}/{phase}"] += self.spent[phase]
        if total is None:
            account.unread += 1
        else:
            account.sandbox_cpu[kind] += total
            account.command_cpu[f"{kind}/bootstrap+idle"] += total - sum(self.spent.values())
        if times is not None:
            account.runc_before_close += times[1]

    async def __aenter__(self) -> MeteredSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class MeteredAdapter(ForkingTrackingAdapter):
    def __init__(self, inner: CountingDocker, account: Account, shims: ShimWatch, fork: bool):
        super().__init__(inner)
        self.account, self.shims, self.fork = account, shims, fork
        if not fork:  # the engine forks only where the adapter has snapshot()
            self.snapshot = None  # type: ignore[assignment]

    async def create(self, spec: Any) -> Any:
        sandbox = await TrackingAdapter.create(self, spec)
        container_id = self.inner.container_ids.get(sandbox.id, "")
        return MeteredSandbox(sandbox, cgroup_usage_file(container_id), self.account, self.shims, container_id)

    async def snapshot(self, sandbox: Any) -> str:  # type: ignore[override]
        sandbox.snapshotted = True
        return await super().snapshot(sandbox)


# -- the run -----------------------------------------------------------------------------------


async def metered_run(args: argparse.Namespace, fork: bool, warm: bool, **options: Any) -> dict[str, Any]:
    module = load_recipe("swe")
    agent = module.make_policy("oracle")
    account, shims = Account(), ShimWatch()
    inner = CountingDocker(**options)
    adapter = MeteredAdapter(inner, account, shims, fork)
    dockerd = pids_named("dockerd")
    # docker's own containerd (a kind cluster's runs beside it on a shared machine)
    daemons = {"dockerd": dockerd, "containerd": [p for d in dockerd for p in pids_named("containerd", d)]}

    def daemon_cpu() -> dict[str, float]:
        return {name: sum((procfs.cpu_seconds(p) or (0.0, 0.0))[0] for p in pids) for name, pids in daemons.items()}

    tasks = module.load_tasks("builtin")
    n = -(-args.episodes // args.group_size) * args.group_size
    shims.start()
    load_before = os.getloadavg()[0]
    usage0, daemons0, machine0 = resource.getrusage(resource.RUSAGE_SELF), daemon_cpu(), procfs.machine_busy_seconds()
    watch0 = shims.cpu
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    finished = []
    try:
        pool = Pool(adapter)
        stream = rollout(
            tasks,
            agent,
            pool,
            n=n,
            group_size=args.group_size,
            concurrency=args.concurrency,
            warm=args.concurrency if warm else 0,
        )
        async with pool:
            async for trajectory in stream:
                finished.append(trajectory)
    finally:
        wall = time.perf_counter() - started
        usage1, daemons1, machine1 = (
            resource.getrusage(resource.RUSAGE_SELF),
            daemon_cpu(),
            procfs.machine_busy_seconds(),
        )
        watch1 = shims.cpu
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_after = os.getloadavg()[0]
        shims.look()
        shims.stop()
        await adapter.close()
    ours = set(inner.container_ids.values())
    shim_own = sum(own for cid, (own, _) in shims.last.items() if cid in ours)
    summary = summarize(finished, wall_s=wall)
    per = 1.0 / max(1, len(finished))
    cpu = {
        "controller (this process)": (usage1.ru_utime + usage1.ru_stime)
        - (usage0.ru_utime + usage0.ru_stime)
        - (watch1 - watch0),
        "controller's children (host git)": (children1.ru_utime + children1.ru_stime)
        - (children0.ru_utime + children0.ru_stime),
        "dockerd": daemons1["dockerd"] - daemons0["dockerd"],
        "containerd": daemons1["containerd"] - daemons0["containerd"],
        "containerd-shim (own)": shim_own,
        "runc (create, start, exec; reaped by the shim)": account.runc_before_close,
        **{f"in containers: {kind}": seconds for kind, seconds in sorted(account.sandbox_cpu.items())},
    }
    attributed = sum(cpu.values())
    machine = machine1 - machine0
    return {
        "subject": "docker"
        + ("+fork" if fork else "")
        + ("+warm" if warm else "")
        + (f" {options}" if options else ""),
        "episodes": len(finished),
        "success": summary.success_rate,
        "wall_s": round(wall, 2),
        "episodes_per_s": round(len(finished) / wall, 3),
        "load_1m": [round(load_before, 2), round(load_after, 2)],
        "cpu_s_per_episode": {key: round(value * per, 4) for key, value in cpu.items()},
        "attributed_per_episode": round(attributed * per, 4),
        "machine_busy_per_episode": round(machine * per, 4),
        "machine_busy_share_of_2_cores": round(machine / (wall * os.cpu_count()), 3),
        "in_container_by_command": {k: round(v * per, 4) for k, v in sorted(account.command_cpu.items())},
        "commands_per_episode": {k: round(v * per, 2) for k, v in sorted(account.commands.items())},
        "sandboxes_per_episode": {k: round(v * per, 3) for k, v in sorted(account.sandboxes.items())},
        "cgroups_unread": account.unread,
        "measuring_cpu_s (not counted above)": round(watch1 - watch0, 3),
        "errors": dict(Counter(t.error[:200] for t in finished if t.error)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--fork", action="store_true", help="groups set up once and forked")
    parser.add_argument("--warm", action="store_true", help="a warm pool of the next `concurrency` episodes")
    parser.add_argument("--plain-too", action="store_true", help="also a plain cold run first, same process")
    parser.add_argument(
        "--network-both", action="store_true", help="each run with light_network off, then on (the default)"
    )
    parser.add_argument("--pytest-split", action="store_true", help="take the scorer's test run apart instead")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lifecycles", type=int, default=0, help="N sandboxes one after another, each measured")
    parser.add_argument(
        "--extra-execs", type=int, default=0, help="with --lifecycles: every other one opens this many docker execs"
    )
    args = parser.parse_args()

    async def run() -> Any:
        from orchard_async.bench.sandbox_cpu import lifecycles, pytest_split

        if args.lifecycles:
            return await lifecycles(args.lifecycles, args.extra_execs, args.network_both)
        if args.pytest_split:
            return await pytest_split(args.repeats)
        runs = []
        for options in [{"light_network": False}, {}] if args.network_both else [{}]:
            if args.plain_too and (args.fork or args.warm):
                runs.append(await metered_run(args, False, False, **options))
            runs.append(await metered_run(args, args.fork, args.warm, **options))
        return runs

    print(json.dumps(anyio.run(run), indent=1))


if __name__ == "__main__":
    main()

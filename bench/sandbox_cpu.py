"""What one docker sandbox and the SWE scorer's test command cost in CPU, measured alone (for
``bench/episode_cpu.py``'s ``--lifecycles`` and ``--pytest-split``; see that module)."""

from __future__ import annotations

import resource
from collections import defaultdict
from typing import Any

import anyio

from orchard_async import load_recipe
from orchard_async.bench.episode_cpu import (
    Account,
    CountingDocker,
    MeteredSandbox,
    ShimWatch,
    cgroup_seconds,
    cgroup_usage_file,
    pids_named,
)
from orchard_async.kit import procfs

# -- pytest taken apart ------------------------------------------------------------------------

SPLIT_STEPS = (
    ("shell helper round trip (true)", "true"),
    ("interpreter start (python3 -c pass)", "python3 -c pass"),
    ("+ import pytest", "python3 -c 'import pytest'"),
    ("+ collection (--collect-only)", "python3 -m pytest -q -p no:cacheprovider --collect-only >/dev/null"),
)


async def pytest_split(repeats: int) -> dict[str, Any]:
    from orchard_async.recipes.swe import scoring

    module = load_recipe("swe")
    adapter = CountingDocker()
    shims = ShimWatch()
    out: dict[str, Any] = {}
    seen: set[str] = set()
    try:
        for task in module.load_tasks("builtin"):
            if task.instance.repo in seen:
                continue
            seen.add(task.instance.repo)
            raw = await adapter.create(task.spec)
            cid = adapter.container_ids[raw.id]
            sandbox = MeteredSandbox(raw, cgroup_usage_file(cid), Account(), shims, cid)
            await task.prepare(sandbox)
            await scoring.apply_test_patch(sandbox, task.instance, 60)
            steps = [
                *SPLIT_STEPS,
                ("whole test run (the scorer's script)", scoring.test_run_script(task.test_command, task.activation)),
            ]
            rows = {}
            for label, command in steps:
                spent = []
                for _ in range(repeats):
                    before = cgroup_seconds(sandbox._cgroup)
                    result = await raw.exec(command, env=scoring.TEST_ENV, timeout=120)
                    after = cgroup_seconds(sandbox._cgroup)
                    assert result.ok, (label, result.text[-500:], result.error_text[-500:])
                    spent.append(after - before)
                spent.sort()
                rows[label] = round(spent[len(spent) // 2], 4)  # the median
            durations = await raw.exec(
                "python3 -m pytest -q -p no:cacheprovider --durations=0 --durations-min=0 | "
                'awk \'$1 ~ /s$/ && ($2=="call"||$2=="setup"||$2=="teardown") {sub(/s$/,"",$1); t+=$1} '
                "END {print t}'",
                env=scoring.TEST_ENV,
                timeout=120,
            )
            rows["tests' own time by --durations (wall s)"] = float(durations.text.strip() or 0)
            out[task.instance.repo] = rows
            await raw.close()
    finally:
        await adapter.close()
    return out


# -- one sandbox's life, alone -------------------------------------------------------------------


async def lifecycles(count: int, extra_execs: int = 0, network_both: bool = False) -> dict[str, Any]:
    """``count`` sandboxes of the SWE spec one after another: create, one ``true``, close; each
    one's CPU by who spent it. Other users of the daemon and the machine only add to a
    sample, so the low quartile is the closest to one sandbox's own cost."""
    module = load_recipe("swe")
    spec = module.load_tasks("builtin")[0].spec
    # with network_both, every other sandbox comes from an adapter with light_network off
    adapters = [CountingDocker(), CountingDocker(light_network=False)] if network_both else [CountingDocker()]
    shims = ShimWatch()
    shims.start()
    dockerd = pids_named("dockerd")
    containerd = [p for d in dockerd for p in pids_named("containerd", d)]

    def daemon(pids: list[int]) -> float:
        return sum((procfs.cpu_seconds(p) or (0.0, 0.0))[0] for p in pids)

    samples: defaultdict[str, list[float]] = defaultdict(list)
    try:
        for index in range(count):
            account = Account()
            usage0, watch0 = resource.getrusage(resource.RUSAGE_SELF), shims.cpu
            d0, c0, m0 = daemon(dockerd), daemon(containerd), procfs.machine_busy_seconds()
            adapter = adapters[index % len(adapters)]
            raw = await adapter.create(spec)
            cid = adapter.container_ids[raw.id]
            sandbox = MeteredSandbox(raw, cgroup_usage_file(cid), account, shims, cid)
            await sandbox.exec("true")
            for _ in range(extra_execs if index % 2 else 0):  # every other sandbox: what one more docker exec costs
                stream = await raw.open_stream(["true"])
                await stream.aclose()
            await sandbox.close()
            await anyio.sleep(0.3)  # the shim's last work (runc delete) and its exit
            usage1, watch1 = resource.getrusage(resource.RUSAGE_SELF), shims.cpu
            shim_own = shims.last.get(cid, (0.0, 0.0))[0]
            row = {
                "controller": (usage1.ru_utime + usage1.ru_stime)
                - (usage0.ru_utime + usage0.ru_stime)
                - (watch1 - watch0),
                "dockerd": daemon(dockerd) - d0,
                "containerd": daemon(containerd) - c0,
                "containerd-shim (own)": shim_own,
                "runc (create, start, exec)": account.runc_before_close,
                "in the container": sum(account.sandbox_cpu.values()),
            }
            row["machine (all cores, everyone)"] = procfs.machine_busy_seconds() - m0
            for key, value in row.items():
                variant = f" +{extra_execs} execs" if extra_execs and index % 2 else ""
                variant += (" (light_network off)" if index % 2 else "") if network_both else ""
                samples[f"{key}{variant}"].append(value)
    finally:
        shims.stop()
        for adapter in adapters:
            await adapter.close()

    def quartiles(values: list[float]) -> list[float]:
        values = sorted(values)
        return [round(values[len(values) // 4], 4), round(values[len(values) // 2], 4)]

    return {"count": count, "low quartile, median (CPU s)": {k: quartiles(v) for k, v in samples.items()}}

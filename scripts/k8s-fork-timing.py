"""Kubernetes forks against plain creates, in one run (docs/performance.md, "Kubernetes forks").

    bash scripts/ci-kubernetes.sh run -- python scripts/k8s-fork-timing.py [ROUNDS]
    bash scripts/ci-kubernetes.sh run -- python scripts/k8s-fork-timing.py methods [ROUNDS]

For each work dir size (a small tree, and a copy of the image's Python standard library when
it has python3): a base sandbox is set up and snapshotted ROUNDS times (snapshot p50), and
ROUNDS plain creates alternate with ROUNDS fork creates (create p50 each). Prints one line per
size with the 1-minute load average before and after.

``methods``: the two snapshot methods side by side (containerd image import, and the tar of
the work dir), plus 8 plain creates as the baseline, per work dir size and round, in turn: a
set-up base is snapshotted, then 8 forks are created at once from the snapshot (time to the
8th ready); p50 over ROUNDS of the snapshot, the 8 forks and their sum, with the load."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import anyio

import orchard_async as oa

SMALL = "mkdir -p repo/src && for i in $(seq 1 50); do echo line-$i > repo/src/f$i.txt; done"
STDLIB = SMALL + ' && cp -r "$(python3 -c \'import sysconfig; print(sysconfig.get_paths()["stdlib"])\')" stdlib'


async def timed(work) -> tuple[float, object]:
    start = time.perf_counter()
    result = await work
    return (time.perf_counter() - start) * 1000, result


async def measure(adapter: oa.Adapter, setup: str, rounds: int) -> str:
    spec = oa.SandboxSpec(ttl=600)
    base = await adapter.create(spec)
    try:
        done = await base.exec(setup)
        if not done.ok:
            return f"setup failed: {done.error_text}"
        size = (await base.exec("du -sk . | cut -f1")).stdout.decode().strip()
        snapshots, snapshot_ms, plain_ms, fork_ms = [], [], [], []
        for _ in range(rounds):
            took, snapshot = await timed(adapter.snapshot(base))
            snapshot_ms.append(took)
            snapshots.append(snapshot)
        forked = oa.SandboxSpec(ttl=600, snapshot=snapshots[0])
        for _ in range(rounds):
            for which, times in ((spec, plain_ms), (forked, fork_ms)):
                took, box = await timed(adapter.create(which))
                times.append(took)
                await box.close()
        for snapshot in snapshots:
            await adapter.drop_snapshot(snapshot)
    finally:
        await base.close()
    p50 = statistics.median
    return (
        f"work dir {size} KiB: snapshot p50 {p50(snapshot_ms):.0f} ms; create p50 plain {p50(plain_ms):.0f} ms, "
        f"fork {p50(fork_ms):.0f} ms (fork - plain {p50(fork_ms) - p50(plain_ms):.0f} ms); {rounds} rounds"
    )


async def main(rounds: int) -> None:
    async with oa.get_adapter("kubernetes", namespace="orchard-fork-timing") as adapter:
        print(await adapter.doctor())
        probe = await adapter.create(oa.SandboxSpec(ttl=120))
        has_python = (await probe.exec("command -v python3")).ok
        await probe.close()
        for setup in (SMALL, STDLIB) if has_python else (SMALL,):
            before = os.getloadavg()[0]
            line = await measure(adapter, setup, rounds)
            print(f"{line}; load {before:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)


GROUP = 8


async def create_many(adapter: oa.Adapter, spec: oa.SandboxSpec) -> tuple[float, list[oa.Sandbox]]:
    made: list[oa.Sandbox] = []

    async def one() -> None:
        made.append(await adapter.create(spec))

    start = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(GROUP):
            group.start_soon(one)
    return (time.perf_counter() - start) * 1000, made


async def snapshot_and_fork(adapter: oa.Adapter, setup: str) -> tuple[float, float, str, str, dict]:
    """One base set up, snapshotted, GROUP forks at once: (snapshot ms, forks ms, method, work
    dir KiB, the containerd build's steps)."""
    base = await adapter.create(oa.SandboxSpec(ttl=600))
    try:
        assert (await base.exec(setup)).ok
        size = (await base.exec("du -sk . | cut -f1")).stdout.decode().strip()
        took, snapshot = await timed(adapter.snapshot(base))
        lease = json.loads((adapter.snapshot_dir / snapshot / "lease.json").read_text())  # type: ignore[attr-defined]
        method, built = lease["method"], lease.get("built", {})
        forks_ms, forks = await create_many(adapter, oa.SandboxSpec(ttl=600, snapshot=snapshot))
        for box in forks:  # each fork has the work dir
            assert (await box.exec("test -s repo/src/f50.txt")).ok
            await box.close()
        await adapter.drop_snapshot(snapshot)
    finally:
        await base.close()
    return took, forks_ms, method, size, built


async def methods(rounds: int) -> None:
    options = {"namespace": "orchard-fork-timing"}
    async with (
        oa.get_adapter("kubernetes", snapshot_method="containerd", **options) as by_image,
        oa.get_adapter("kubernetes", snapshot_method="tar", **options) as by_tar,
    ):
        print(await by_image.doctor())
        probe = await by_image.create(oa.SandboxSpec(ttl=120))
        has_python = (await probe.exec("command -v python3")).ok
        await probe.close()
        for setup in (SMALL, STDLIB) if has_python else (SMALL,):
            before = os.getloadavg()[0]
            plain: list[float] = []
            steps: dict[str, list[float]] = {}
            timings: dict[str, tuple[list[float], list[float]]] = {"containerd": ([], []), "tar": ([], [])}
            for round_ in range(rounds):
                took, boxes = await create_many(by_tar, oa.SandboxSpec(ttl=600))
                plain.append(took)
                for box in boxes:
                    await box.close()
                for adapter in (by_image, by_tar) if round_ % 2 == 0 else (by_tar, by_image):
                    snap_ms, forks_ms, method, size, built = await snapshot_and_fork(adapter, setup)
                    for key, value in built.items():
                        if key.endswith("_ms"):
                            steps.setdefault(key, []).append(value)
                    timings[method][0].append(snap_ms)
                    timings[method][1].append(forks_ms)
            p50 = statistics.median
            print(f"work dir {size} KiB: {GROUP} plain creates p50 {p50(plain):.0f} ms")
            for method, (snaps_ms, forks_ms) in timings.items():
                total = [a + b for a, b in zip(snaps_ms, forks_ms, strict=True)]
                print(
                    f"  {method}: snapshot p50 {p50(snaps_ms):.0f} ms, {GROUP} forks p50 {p50(forks_ms):.0f} ms, "
                    f"snapshot+forks p50 {p50(total):.0f} ms (min {min(total):.0f}, max {max(total):.0f}); {rounds} rounds"
                )
            print("  containerd snapshot steps p50: " + ", ".join(f"{k} {p50(v):.0f}" for k, v in steps.items()))
            print(f"  load {before:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["methods"]:
        anyio.run(methods, int(sys.argv[2]) if len(sys.argv) > 2 else 3)
    else:
        anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 5)

"""Kubernetes forks against plain creates, in one run (docs/performance.md, "Kubernetes forks").

    bash scripts/ci-kubernetes.sh run -- python scripts/k8s-fork-timing.py [ROUNDS]

For each work dir size (a small tree, and a copy of the image's Python standard library when
it has python3): a base sandbox is set up and snapshotted ROUNDS times (snapshot p50), and
ROUNDS plain creates alternate with ROUNDS fork creates (create p50 each). Prints one line per
size with the 1-minute load average before and after."""

from __future__ import annotations

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


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 5)

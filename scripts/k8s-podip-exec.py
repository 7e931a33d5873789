"""Exec latency on kubernetes over the pod IP (the relay) vs the exec websocket, in one run.

    bash scripts/ci-kubernetes.sh run -- python scripts/k8s-podip-exec.py [--ops 400] [--sandboxes 8]

Two adapters on the same cluster, one with ``pod_ip`` (the default) and one without; the
same image (ORCHARD_K8S_IMAGE: it needs python3 for the relay), the same command (`true`),
the two sides interleaved command by command so that load from elsewhere hits both alike.
At concurrency 1 (one sandbox each) and at concurrency N (N sandboxes each, one command in
flight per sandbox). Prints a markdown table and the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import anyio

import orchard_async as oa
from orchard_async.adapters.kubernetes import KubernetesAdapter, PodIpTransport


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(box: oa.Sandbox, into: list[float]) -> None:
    started = time.perf_counter()
    result = await box.exec("true")
    into.append(time.perf_counter() - started)
    assert result.ok, result


async def main(ops: int, sandboxes: int) -> None:
    image = os.environ.get("ORCHARD_K8S_IMAGE", "orchard/python:test")
    common = {"image": image, "namespace": "orchard-bench"}
    load_before = os.getloadavg()[0]
    async with KubernetesAdapter(**common) as relay, KubernetesAdapter(pod_ip=False, **common) as websocket:
        sides = {"pod IP (relay)": relay, "exec websocket": websocket}
        boxes = {
            name: [await adapter.create(oa.SandboxSpec(ttl=900)) for _ in range(sandboxes)]
            for name, adapter in sides.items()
        }
        assert isinstance(relay.transport, PodIpTransport) and relay.transport.stats["exec"] == 0, relay.transport.stats
        for name in sides:  # warm up: first commands pay connection set-up
            for box in boxes[name]:
                await box.exec("true")
        rows = []
        for level in (1, sandboxes):
            samples: dict[str, list[float]] = {name: [] for name in sides}
            for _ in range(max(1, ops // level)):
                for name in sides:  # interleaved: one round on each side in turn
                    async with anyio.create_task_group() as group:
                        for box in boxes[name][:level]:
                            group.start_soon(timed, box, samples[name])
            for name, values in samples.items():
                rows.append(
                    f"| {name} | {level} | {len(values)} | {statistics.median(values) * 1000:.2f} | "
                    f"{percentile(values, 0.9) * 1000:.2f} | {percentile(values, 0.99) * 1000:.2f} |"
                )
        for name in sides:
            for box in boxes[name]:
                await box.close()
        stats = dict(relay.transport.stats)
    print(f"image {image}; relay transport stats {stats}")
    print("| route | concurrency | commands | p50 ms | p90 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"1-minute load average: {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=400, help="commands per side and level")
    parser.add_argument("--sandboxes", type=int, default=8, help="sandboxes per side (the second concurrency level)")
    args = parser.parse_args()
    anyio.run(main, args.ops, args.sandboxes)

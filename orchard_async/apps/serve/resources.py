"""``GET /resources``: what the service can still create, for the key that asks.

Two limits bound it: the service's own quotas (``--max-sandboxes``, and the key's live
sandboxes and creates per minute) and the backend's capacity (this machine's CPUs and memory
for local, the daemon's for docker, the nodes' allocatable resources less what pods request
for kubernetes). Quotas are exact; the backend's numbers are what the backend reports at the
moment of asking. A backend that cannot be asked (a kubernetes key without the right to list
nodes) answers ``{"error": ...}`` in its place, never a failed request.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio

import orchard_async as oa
from orchard_async.apps.serve.keys import Tenant
from orchard_async.apps.serve.registry import Registry

BACKEND_TIMEOUT = 10.0  # seconds the backend may take to say what it has


def quotas(registry: Registry, tenant: Tenant) -> dict[str, Any]:
    live = registry.live_counts()
    total = sum(live.values())
    mine = live.get(tenant.name, 0)
    rate = tenant.creates_per_minute
    recent = registry.rate.recent(tenant, time.monotonic())
    return {
        "service": {
            "max_sandboxes": registry.max_sandboxes,
            "live": total,
            "free": max(0, registry.max_sandboxes - total),
        },
        "key": {
            "name": tenant.name,
            "max_sandboxes": tenant.max_sandboxes,
            "live": mine,
            "free": max(0, tenant.max_sandboxes - mine),
            "creates_per_minute": rate,
            "creates_left_this_minute": max(0, rate - recent),
        },
    }


def can_create(answer: dict[str, Any]) -> int:
    """How many sandboxes the quotas still allow this key now."""
    key, service = answer["key"], answer["service"]
    return min(key["free"], service["free"], key["creates_left_this_minute"])


async def backend(adapter: oa.Adapter) -> dict[str, Any]:
    kind = {"kind": adapter.name}
    try:
        with anyio.fail_after(BACKEND_TIMEOUT):
            if adapter.name == "local":
                return kind | local_capacity()
            if adapter.name == "docker":
                return kind | await docker_capacity(adapter)
            if adapter.name == "kubernetes":
                return kind | await kubernetes_capacity(adapter)
    except Exception as exc:  # noqa: BLE001 - reported in the answer: the quotas still hold
        return kind | {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    return kind  # a backend without capacity to report (sim, remote)


def local_capacity() -> dict[str, Any]:
    meminfo = {}
    with open("/proc/meminfo") as lines:
        for line in lines:
            name, _, value = line.partition(":")
            meminfo[name] = int(value.split()[0]) * 1024
    return {
        "cpus": os.cpu_count(),
        "load_1m": round(os.getloadavg()[0], 2),
        "memory_bytes": meminfo["MemTotal"],
        "memory_available_bytes": meminfo.get("MemAvailable", meminfo["MemFree"]),
    }


async def docker_capacity(adapter: Any) -> dict[str, Any]:
    info = await adapter.api.info()
    return {
        "cpus": info.get("NCPU"),
        "memory_bytes": info.get("MemTotal"),
        "containers_running": info.get("ContainersRunning"),
        "nvidia_runtime": "nvidia" in (info.get("Runtimes") or {}),
    }


async def kubernetes_capacity(adapter: Any) -> dict[str, Any]:
    nodes = await adapter.api.request("GET", "/api/v1/nodes", what="nodes", retry_for=0)
    pods = await adapter.api.request(
        "GET", "/api/v1/pods", what="pods", query=[("fieldSelector", "status.phase=Running")], retry_for=0
    )
    allocatable: dict[str, float] = {}
    for node in nodes.get("items", []):
        if any(taint.get("effect") == "NoSchedule" for taint in node.get("spec", {}).get("taints") or []):
            continue
        for name, value in (node.get("status", {}).get("allocatable") or {}).items():
            if name in ("cpu", "memory", "nvidia.com/gpu", "pods"):
                allocatable[name] = allocatable.get(name, 0.0) + quantity(value)
    requested: dict[str, float] = {}
    for pod in pods.get("items", []):
        for container in pod.get("spec", {}).get("containers", []):
            for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
                requested[name] = requested.get(name, 0.0) + quantity(value)
        requested["pods"] = requested.get("pods", 0.0) + 1
    return {
        name: {"allocatable": allocatable[name], "requested": requested.get(name, 0.0)} for name in sorted(allocatable)
    }


SUFFIXES = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity ('500m', '16Gi', '4') as a number (cores, bytes, counts)."""
    text = str(value)
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * SUFFIXES[suffix]
    return float(text)

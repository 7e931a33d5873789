"""What a controller removes of sandboxes that are no one's any more (their TTL passed, they
ended, or their controller is dead), and their leftover allow policies, through the ``api``."""

from __future__ import annotations

import functools
import time
from collections.abc import Collection
from typing import Any

from orchard_async.adapters.kubernetes.api import NETWORKING, ApiError, KubeApi
from orchard_async.errors import OrchardError
from orchard_async.kit import container_shell
from orchard_async.kit import labels as names


async def reap(api: KubeApi, older_than: float, *, keep: Collection[str], policies: bool) -> list[str]:
    """Delete orchard pods in the api's namespace (anyone's but ``keep``) whose TTL passed
    ``older_than`` seconds ago, that ended, or whose controller is dead; and, with
    ``policies`` (the adapter manages NetworkPolicies), allow policies whose pod is gone.
    Lists first, completely: a failed list raises before anything is deleted. Returns the
    deleted pods."""
    policy_path = api.path("networkpolicies", group=NETWORKING)
    # policies before pods: a policy is created after its pod, so one whose pod is
    # missing from the later pod list belongs to a pod that is really gone
    found_policies = await api.list_all(policy_path, names.SANDBOX, "policy list") if policies else []
    # page by page, keeping names only: bounded memory however many pods the namespace has
    now = time.time()
    doomed: list[str] = []
    present: set[str] = set()
    async for pods in api.pages(api.path("pods"), f"{names.OWNER},{names.EXPIRES}", "pod list for reap"):
        for pod in pods:
            name = pod["metadata"]["name"]
            present.add(name)
            if (
                name not in keep
                and not pod["metadata"].get("deletionTimestamp")
                and _pod_abandoned(pod, now, older_than)
            ):
                doomed.append(name)
    orphans = [
        policy["metadata"]["name"]
        for policy in found_policies
        if policy["metadata"].get("labels", {}).get(names.SANDBOX) not in present
    ]
    removed: list[str] = []

    async def remove_pod(name: str) -> None:
        try:
            await api.delete(api.path("pods", name), f"pod {name} delete")
        except (OrchardError, ApiError):
            return  # the next reap tries again
        removed.append(name)

    async def remove_policy(name: str) -> None:
        try:
            await api.delete(f"{policy_path}/{name}", f"policy {name} delete")
        except (OrchardError, ApiError):
            return

    await container_shell.concurrently(
        *(functools.partial(remove_pod, name) for name in doomed),
        *(functools.partial(remove_policy, name) for name in orphans),
    )
    return removed


def _pod_abandoned(pod: dict[str, Any], now: float, older_than: float) -> bool:
    metadata = pod["metadata"]
    # ended (TTL, deadline, its shell's websocket closed): of no use to anyone
    ended = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
    alive = names.annotated_controller_alive((metadata.get("annotations") or {}).get(names.CONTROLLER_ANNOTATION))
    return container_shell.is_abandoned(
        metadata.get("labels") or {}, ended=ended, controller_alive=alive, now=now, older_than=older_than
    )

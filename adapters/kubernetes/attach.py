"""Taking over a sandbox pod made with a reattach grace whose controller is gone (see
orchard_async.kit.container_reattach): ``adoptable`` finds the pod through the ``api``, checks it
through the ``transport`` and waits until its old session has ended; the adapter then opens
its own shell on it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from orchard_async.adapters.kubernetes.api import KubeApi
from orchard_async.adapters.kubernetes.egress import EGRESS_CONTAINER
from orchard_async.adapters.kubernetes.transport import PodRef, Transport
from orchard_async.adapters.kubernetes.watch import pod_verdict
from orchard_async.errors import CreateFailed, SandboxLost
from orchard_async.kit import container_reattach
from orchard_async.kit import labels as names

CHECK_TIMEOUT = 20.0
PATIENCE = 10.0  # an old session being killed, or a websocket the kubelet has not closed yet


class Adoptable(NamedTuple):
    """A live sandbox pod free for a new session: what the adapter's sandbox is made of."""

    pod: PodRef
    labels: dict[str, str]
    expires_at: float
    workdir: str
    filtered: bool  # the pod holds the egress filter's sidecar (egress.py)


async def adoptable(
    api: KubeApi, transport: Transport, name: str, *, remove: Callable[[str], Awaitable[object]]
) -> Adoptable:
    """Pod ``name`` of the api's namespace, once its old session has ended. SandboxLost when it
    ended or expired, or cannot take a new session (``remove``d then: of no use to anyone), or
    was made without a reattach grace; CreateFailed while another controller's session is alive."""
    # a list by the pod's own label, not a GET: the Role the adapter needs has no "get" on pods
    pods = await api.list_all(api.path("pods"), f"{names.SANDBOX}={name}", "pod lookup for attach")
    if not pods:
        raise SandboxLost(f"sandbox {name} is gone")
    pod = pods[0]
    metadata = pod["metadata"]
    labels = metadata.get("labels") or {}
    if names.OWNER not in labels:
        raise SandboxLost(f"pod {name} is not an orchard sandbox")
    expires_at = names.expiry(labels)
    verdict, why = pod_verdict(pod)
    if metadata.get("deletionTimestamp") or verdict != "ready" or expires_at <= time.time():
        await remove(name)
        raise SandboxLost(f"sandbox {name} has ended ({why or 'its TTL passed'})")
    if names.REATTACH not in labels:
        raise SandboxLost(f"sandbox {name} was made without a reattach grace: it ends with its controller")
    ref = PodRef(api.namespace, name, (pod.get("status") or {}).get("podIP"))

    async def check() -> bytes:
        try:
            _, out, _ = await transport.run(ref, container_reattach.attach_check_command(), CHECK_TIMEOUT)
        except CreateFailed as exc:
            raise SandboxLost(f"sandbox {name} cannot be attached to: {exc}") from None
        except TimeoutError:
            return b""  # no answer: waited out, then CreateFailed
        return out

    try:
        workdir = await container_reattach.wait_attachable(check, name, PATIENCE)
    except SandboxLost:  # it takes no exec, or its timer is not on record
        await remove(name)
        raise
    containers = (pod.get("spec") or {}).get("containers") or []
    filtered = any(container.get("name") == EGRESS_CONTAINER for container in containers)
    return Adoptable(ref, labels, expires_at, workdir, filtered)

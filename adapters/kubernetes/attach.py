"""``KubernetesAdapter.attach``: a new shell session on a sandbox pod made with a reattach
grace whose controller is gone (see orchard_async.kit.container_shell, "re-attaching")."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from orchard_async.adapters.kubernetes.transport import PodRef
from orchard_async.adapters.kubernetes.watch import pod_verdict
from orchard_async.errors import CreateFailed, SandboxLost
from orchard_async.kit import container_reattach
from orchard_async.kit import labels as names
from orchard_async.kit.sandbox import ShellSandbox

if TYPE_CHECKING:
    from orchard_async.adapters.kubernetes.adapter import KubernetesAdapter

CHECK_TIMEOUT = 20.0
PATIENCE = 10.0  # an old session being killed, or a websocket the kubelet has not closed yet


async def attach(adapter: KubernetesAdapter, name: str) -> ShellSandbox:
    if name in adapter._live:
        return adapter._live[name]
    await adapter._start()
    # a list by the pod's own label, not a GET: the Role the adapter needs has no "get" on pods
    pods = await adapter.api.list_all(adapter.api.path("pods"), f"{names.SANDBOX}={name}", "pod lookup for attach")
    if not pods:
        raise SandboxLost(f"sandbox {name} is gone")
    pod = pods[0]
    metadata = pod["metadata"]
    labels = metadata.get("labels") or {}
    if names.OWNER not in labels:
        raise SandboxLost(f"pod {name} is not an orchard sandbox")
    allow = adapter.config.manage_network_policies  # its allow policy, if any, goes with it
    expires_at = names.expiry(labels)
    verdict, why = pod_verdict(pod)
    if metadata.get("deletionTimestamp") or verdict != "ready" or expires_at <= time.time():
        await adapter._remove(name, allow)
        raise SandboxLost(f"sandbox {name} has ended ({why or 'its TTL passed'})")
    if names.REATTACH not in labels:
        raise SandboxLost(f"sandbox {name} was made without a reattach grace: it ends with its controller")
    ref = PodRef(adapter.namespace, name, (pod.get("status") or {}).get("podIP"))

    async def check() -> bytes:
        try:
            _, out, _ = await adapter.transport.run(ref, container_reattach.attach_check_command(), CHECK_TIMEOUT)
        except CreateFailed as exc:
            raise SandboxLost(f"sandbox {name} cannot be attached to: {exc}") from None
        except TimeoutError:
            return b""  # no answer: waited out, then CreateFailed
        return out

    try:
        workdir = await container_reattach.wait_attachable(check, name, PATIENCE)
    except SandboxLost:  # it takes no exec, or its timer is not on record: of no use to anyone
        await adapter._remove(name, allow)
        raise
    client, relays = await adapter._open_shell(ref, workdir)
    return adapter._sandbox(name, client, relays, labels, expires_at, allow)

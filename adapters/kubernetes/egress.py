"""The egress filter inside a sandbox pod: what holds a sandbox's network where the cluster's
CNI does not enforce NetworkPolicies (a bridge CNI, as the CI cluster's), kept alongside the
pod's NetworkPolicies (defence in depth).

All containers of a pod share its network namespace, so a packet filter installed there holds
for the sandbox container too, which keeps every capability dropped and cannot change it. One
container of the egress image (an iptables with the nf_tables backend and a shell; images:
``orchard/egress:bookworm``), ``egress``, has ``CAP_NET_ADMIN`` and nothing else:

* it comes first in the pod, and its postStart hook installs the filter of the sandbox's
  initial network (``APPLY``): the kubelet starts a pod's containers one after the other and
  runs each one's postStart hook before it starts the next, so the sandbox container's first
  process already runs behind the filter. A hook that fails ends the container, and a pod
  whose ``egress`` container is not running never counts as ready (watch.pod_verdict). This
  costs an exec where an init container would cost the kubelet's next pass over the pod (its
  PLEG relist, about a second);
* it then sleeps until the sandbox container's processes are gone (``WATCH``: the pod then
  ends as it did without it); ``set_network`` execs ``APPLY`` into it with the new policy's
  tables through the exec API, which replaces the filter atomically (``iptables-restore``).

The tables are the local and docker adapters' (orchard_async.kit.egress.filter_table): the
output chain accepts loopback, replies on connections opened to the pod (the controller's
relay and exec traffic), and the allowlist; everything else is rejected.

The pod shares one PID namespace (the pause container reaps the sandbox's zombies), so the
sandbox's processes see the sidecar's. They cannot ptrace it or read its memory (the kernel
refuses a tracer whose capabilities are not a superset of the target's), nor enter it. A
sandbox running as root (the same uid, which is all ``kill`` asks) can kill it: the filter
stays in the namespace as it was, and the next switch finds no container to exec into; the
adapter then ends the sandbox (fails closed) and says why.
"""

from __future__ import annotations

from typing import Any

from orchard_async.capabilities import NetworkPolicy
from orchard_async.kit.egress import filter_table

EGRESS_CONTAINER = "egress"  # the filter's container, which set_network execs into
CAPABILITIES = ["NET_ADMIN"]  # iptables-nft speaks netlink: no raw socket, so no NET_RAW

# `$1` the IPv4 table, `$2` the IPv6 one (skipped on a kernel without IPv6); then the routing
# table, from which the controller reads the pod's gateway (the node, as the pod reaches it).
APPLY = r"""set -e
printf '%s' "$1" | iptables-restore
if [ -d /proc/sys/net/ipv6 ]; then printf '%s' "$2" | ip6tables-restore; fi
cat /proc/net/route
"""

# The sidecar's life: as long as a process of another container (the sandbox's) runs in the
# pod. PID 1 is the pause container; the sidecar's own processes share its cgroups. The
# sandbox container starts right after this one's hook, but a busy kubelet (or one whose API
# server is away) can take long: should it never show (or have ended before this looks), the
# sidecar ends after `$1` seconds, the pod's TTL.
WATCH = r"""own=$(cat /proc/self/cgroup)
seen=; waited=0
while :; do
  other=
  for dir in /proc/[0-9]*; do
    [ "$dir" = /proc/1 ] && continue
    group=$(cat "$dir/cgroup" 2>/dev/null) || continue
    if [ -n "$group" ] && [ "$group" != "$own" ]; then other=1; break; fi
  done
  if [ -n "$other" ]; then seen=1
  elif [ -n "$seen" ] || [ "$waited" -ge "$1" ]; then exit 0
  fi
  waited=$((waited + 1))
  sleep 1
done
"""


def apply_command(policy: NetworkPolicy) -> list[str]:
    """The argv that makes the pod's filter ``policy``'s (in a container of the egress image)."""
    return ["sh", "-c", APPLY, "orchard-egress", filter_table(policy, 4), filter_table(policy, 6)]


# What the filter's container is given where the pod is sized (requests = limits): its shell
# sleeping and an iptables-restore now and then. Not less CPU: under a quota of a few
# millicores a switch's iptables-restore would wait out whole throttling periods.
EGRESS_RESOURCES = {"cpu": "100m", "memory": "32Mi"}


def egress_container(image: str, pull: str, initial: NetworkPolicy, ttl: int) -> dict[str, Any]:
    """The filter's container: ``initial``'s filter installed by its postStart hook, then
    the sidecar set_network execs into (for at most ``ttl`` seconds without a sandbox)."""
    return {
        "name": EGRESS_CONTAINER,
        "image": image,
        "imagePullPolicy": pull,
        "command": ["sh", "-c", WATCH, "orchard-egress", str(ttl)],
        "lifecycle": {"postStart": {"exec": {"command": apply_command(initial)}}},
        "securityContext": {
            "runAsUser": 0,  # iptables needs its capability effective: root in the container
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": list(CAPABILITIES)},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def gateway(route_table: str) -> str | None:
    """The IPv4 default gateway in ``/proc/net/route``'s text (little-endian hex), or None."""
    for line in route_table.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[1] == "00000000" and fields[2] != "00000000":
            try:
                raw = bytes.fromhex(fields[2])
            except ValueError:
                continue
            return ".".join(str(byte) for byte in reversed(raw))
    return None


def image_names(reference: str) -> set[str]:
    """The names a node may report ``reference`` under (with and without docker.io/library/)."""
    name = reference.split("@", 1)[0]
    if ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    first = name.split("/", 1)[0]
    explicit_registry = "/" in name and ("." in first or ":" in first or first == "localhost")
    if explicit_registry:
        return {name}
    full = f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"
    short = full.removeprefix("docker.io/").removeprefix("library/")
    return {full, short, full.removeprefix("docker.io/")}


def node_has_image(node: dict[str, Any], reference: str) -> bool:
    """Whether the node reports ``reference`` among its images (the kubelet reports the largest
    ``nodeStatusMaxImages``, 50 by default)."""
    wanted = image_names(reference)
    for image in (node.get("status") or {}).get("images") or []:
        if wanted & set(image.get("names") or []):
            return True
    return False

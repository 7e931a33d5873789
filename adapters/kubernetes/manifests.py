"""What the adapter asks the cluster for, as pure functions: the sandbox pod, its labels, the
namespace, and the NetworkPolicies. No I/O: tests/adapters/test_kubernetes_manifests.py
checks them without a cluster.

Each pod runs the image with the spec's pull policy, cpu/memory as requests and limits, the
spec's env and labels plus the lease labels (orchard_async.kit.labels); it has
``activeDeadlineSeconds`` = TTL (the kubelet kills it even if nobody else does), no service
account token, no service links, a shared PID namespace (the pause container is PID 1 and
reaps the zombies of commands), every capability dropped, no privilege escalation and the
runtime's default seccomp profile. Its main process is the self-destruct timer (TIMER).
With an egress image (``PodSettings.egress_image``) the pod also holds its egress filter: a
container with CAP_NET_ADMIN only, before the sandbox's (egress.py).
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import msgspec

from orchard_async.adapters.kubernetes.api import NETWORKING
from orchard_async.adapters.kubernetes.egress import EGRESS_RESOURCES, egress_container
from orchard_async.adapters.kubernetes.relay import relay_entry
from orchard_async.capabilities import ONLINE, NetworkPolicy, spec_network
from orchard_async.images import build_command
from orchard_async.kit import labels as names
from orchard_async.kit.container_reattach import adoptable_entry
from orchard_async.kit.container_shell import CTL_DIR, DEFAULT_WORKDIR, timer_args
from orchard_async.protocols import TIMER_NAME
from orchard_async.types import SandboxSpec

CONTAINER = "sandbox"  # the sandbox container's name in its pod
DENY_POLICY = "orchard-deny-egress"
RELAY_POLICY = "orchard-relay-ingress"
PULL_POLICIES = {"missing": "IfNotPresent", "never": "Never", "always": "Always"}
GPU_RESOURCE = "nvidia.com/gpu"  # what NVIDIA's device plugin offers on a node
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"

# The pod's main process: the self-destruct timer. `$1` the attach grace, `$2` the rest of
# the TTL (waited only if a shell attached), `$3` the file the shell writes its pid to. An
# extendable sandbox's (spec.max_extension) then goes on while the deadline in `$4` is later
# (epoch seconds: its pod's DEADLINE_ANNOTATION, which the kubelet projects into a read-only
# downward API volume, so nothing in the pod can change it), never past `$5`, the hard cap
# (activeDeadlineSeconds ends the pod there anyway). It checks the clock after every sleep: a
# sleep cut short sleeps again to the deadline; a deadline that is not a number ends it.
# Backquotes and expr, not `$(`: Kubernetes reads `$(NAME)` in a command as a variable
# reference; `cat`, not `read`: the projected file has no final newline.
TIMER = (
    'sleep "$1"; if [ -e "$3" ]; then if [ -z "$4" ]; then exec sleep "$2"; fi; sleep "$2"; '
    'while d=`cat "$4"` && n=`date +%s` && [ "$d" -gt "$n" ]; do if [ "$d" -gt "$5" ]; then d=$5; fi; '
    'if [ "$d" -le "$n" ]; then break; fi; sleep `expr "$d" - "$n"`; done; fi'
)
DEADLINE_ANNOTATION = "orchard.deadline"  # an extendable sandbox's deadline, epoch seconds
TTL_DIR = "/run/orchard-ttl"  # where its timer reads it (a downward API volume)
DEADLINE_FILE = "deadline"


class PodSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What every sandbox pod of one adapter shares."""

    attach_grace: float  # seconds a pod waits for its shell before ending itself
    reattach_grace: float = 0.0  # seconds a pod outlives its controller (container_shell, "re-attaching")
    read_only: bool = False  # read-only root; the workdir and the control dir get emptyDirs
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []  # core/v1 Toleration objects
    runtime_class: str | None = None  # runtimeClassName (e.g. gvisor, kata)
    priority_class: str | None = None  # priorityClassName
    gpu_runtime_class: str | None = None  # runtimeClassName of pods that ask for GPUs (e.g. nvidia)
    egress_image: str | None = None  # the egress filter's image (egress.py); None: NetworkPolicies only


def sandbox_labels(
    spec: SandboxSpec,
    *,
    name: str,
    owner: str,
    run: str,
    expires_at: float,
    controller: str,
    reattach_grace: float = 0.0,
) -> dict[str, str]:
    """The spec's labels, the lease labels (as valid label values) and the pod's own name
    (the NetworkPolicies select on it); with a reattach grace, its seconds (reap leaves the
    pod to end itself)."""
    lease = names.lease_labels(owner=names.label_value(owner), run=run, expires_at=expires_at, controller=controller)
    if reattach_grace:
        lease[names.REATTACH] = str(reattach_grace)
    return {**spec.labels, **lease, names.SANDBOX: name}


def timer_command(ttl: int, settings: PodSettings, workdir: str, hard_cap: int = 0) -> list[str]:
    """The timer's argv; with ``hard_cap`` (epoch seconds), an extendable sandbox's."""
    deadline = [f"{TTL_DIR}/{DEADLINE_FILE}", str(hard_cap)] if hard_cap else []
    timer = ["sh", "-c", TIMER, TIMER_NAME, *timer_args(ttl, settings.attach_grace), *deadline]
    return adoptable_entry(timer, workdir) if settings.reattach_grace else timer


@functools.lru_cache(maxsize=256)
def built_here(image: str) -> bool:
    """Whether ``orchard-async images build`` makes ``image``; once per image per process:
    the answer reads every installed package's entry points (~90 ms of CPU on the loop), which
    per pod made the controller the bottleneck of a 1,000-pod burst (5 creates/s)."""
    return build_command(image, "kubernetes") is not None


def pull_policy(spec: SandboxSpec, image: str) -> str:
    policy = PULL_POLICIES[spec.pull]
    if policy == "IfNotPresent" and built_here(image):
        return "Never"  # built here by `orchard-async images build`: no registry has it
    return policy


def pod_manifest(
    name: str,
    spec: SandboxSpec,
    image: str,
    labels: dict[str, str],
    settings: PodSettings,
    *,
    identity: dict[str, str],
    owner: str,
    relay: tuple[int, str] | None = None,
) -> dict[str, Any]:
    """The sandbox pod. ``identity`` (orchard_async.kit.labels.controller_identity) goes into an
    annotation for reap, with the owner unshortened. ``relay`` (port, secret): the pod also
    runs the relay (relay.py) that accepts the secret (the spec carries only its digest)."""
    ttl = max(1, math.ceil(spec.ttl))
    # The hard cap of an extendable sandbox's life: the kubelet ends its pod there whatever
    # its timer does (activeDeadlineSeconds can only be lowered once the pod exists).
    lifetime = ttl + math.ceil(spec.max_extension)
    expires = int(labels.get(names.EXPIRES, "0") or 0)
    hard_cap = expires + math.ceil(spec.max_extension) + 1 if spec.max_extension else 0
    command = timer_command(ttl, settings, spec.workdir or DEFAULT_WORKDIR, hard_cap)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": pull_policy(spec, image),
        "command": relay_entry(command, *relay) if relay else command,
        "env": [{"name": key, "value": value} for key, value in spec.env.items()],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            # su/setpriv to the image's other users when the spec asks, and nothing else
            "capabilities": {"drop": ["ALL"], **({"add": ["SETGID", "SETUID"]} if spec.switch_users else {})},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    quantities: dict[str, str] = {}
    if spec.cpu:
        quantities["cpu"] = f"{math.ceil(spec.cpu * 1000)}m"
    if spec.memory_bytes:
        quantities["memory"] = str(spec.memory_bytes)
    if spec.gpus:  # the device plugin's extended resource (an extended resource's request must equal its limit)
        quantities[GPU_RESOURCE] = str(spec.gpus)
    if quantities:  # requests = limits: what the scheduler reserves is what the pod may use
        container["resources"] = {"requests": quantities, "limits": dict(quantities)}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": lifetime,
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "shareProcessNamespace": True,
        "containers": [container],
    }
    annotations = {names.CONTROLLER_ANNOTATION: json.dumps(identity), names.OWNER_ANNOTATION: owner}
    if settings.egress_image:
        # first: its postStart hook installs the filter before the sandbox container starts (egress.py)
        egress_pull = "Never" if built_here(settings.egress_image) else "IfNotPresent"
        egress = egress_container(settings.egress_image, egress_pull, spec_network(spec.network), lifetime)
        if {"cpu", "memory"} <= set(quantities):
            # every container's requests = limits, or a pod sized to be Guaranteed is only Burstable
            egress["resources"] = {"requests": dict(EGRESS_RESOURCES), "limits": dict(EGRESS_RESOURCES)}
        pod_spec["containers"].insert(0, egress)
        annotations[DEFAULT_CONTAINER_ANNOTATION] = CONTAINER  # `kubectl exec` into the sandbox, not the filter
    if settings.read_only:
        container["securityContext"]["readOnlyRootFilesystem"] = True
        workdir = spec.workdir or DEFAULT_WORKDIR
        container["volumeMounts"] = [{"name": "work", "mountPath": workdir}, {"name": "ctl", "mountPath": CTL_DIR}]
        pod_spec["volumes"] = [{"name": "work", "emptyDir": {}}, {"name": "ctl", "emptyDir": {}}]
        for index, path in enumerate(sorted(set(spec.writable_dirs))):  # as the workdir: writable on a read-only root
            container["volumeMounts"].append({"name": f"dir-{index}", "mountPath": path})
            pod_spec["volumes"].append({"name": f"dir-{index}", "emptyDir": {}})
    if spec.max_extension:
        annotations[DEADLINE_ANNOTATION] = str(expires + 1)  # labels round down; the timer waits it out whole
        container.setdefault("volumeMounts", []).append({"name": "ttl", "mountPath": TTL_DIR, "readOnly": True})
        pod_spec.setdefault("volumes", []).append(
            {
                "name": "ttl",
                "downwardAPI": {
                    "items": [
                        {
                            "path": DEADLINE_FILE,
                            "fieldRef": {"fieldPath": f"metadata.annotations['{DEADLINE_ANNOTATION}']"},
                        }
                    ]
                },
            }
        )
    optional = {
        "nodeSelector": settings.node_selector,
        "tolerations": settings.tolerations,
        "runtimeClassName": (spec.gpus and settings.gpu_runtime_class) or settings.runtime_class,
        "priorityClassName": settings.priority_class,
    }
    pod_spec.update({key: value for key, value in optional.items() if value})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": pod_spec,
    }


def gpus_of(node: dict[str, Any]) -> int:
    """The GPUs a node offers pods (its allocatable nvidia.com/gpu); 0 for one that is cordoned."""
    if (node.get("spec") or {}).get("unschedulable"):
        return 0
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    try:
        return int(allocatable.get(GPU_RESOURCE, 0))
    except ValueError:
        return 0


def namespace_manifest(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {names.NAMESPACE: "true"}},
    }


def deny_egress_policy() -> dict[str, Any]:
    """Namespace-wide, every sandbox pod (label ``orchard.sandbox``) may send nothing.
    NetworkPolicies add up: a sandbox that asks for network gets its own allow policy. Pods
    without the label (a controller running in the same namespace) are not affected."""
    return {
        "apiVersion": NETWORKING,
        "kind": "NetworkPolicy",
        "metadata": {"name": DENY_POLICY, "labels": {names.POLICY: "deny-egress"}},
        "spec": {
            "podSelector": {"matchExpressions": [{"key": names.SANDBOX, "operator": "Exists"}]},
            "policyTypes": ["Egress"],
            "egress": [],
        },
    }


def relay_ingress_policy() -> dict[str, Any]:
    """Namespace-wide: a sandbox pod accepts connections only from pods that are not sandboxes
    (a controller in the cluster, in any namespace), and, as every NetworkPolicy allows, from
    its own node (a controller there). Another sandbox, even one with ``network="on"``, cannot
    reach a sandbox's relay. Enforced only by a CNI with NetworkPolicy support."""
    return {
        "apiVersion": NETWORKING,
        "kind": "NetworkPolicy",
        "metadata": {"name": RELAY_POLICY, "labels": {names.POLICY: "relay-ingress"}},
        "spec": {
            "podSelector": {"matchExpressions": [{"key": names.SANDBOX, "operator": "Exists"}]},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {},
                            "podSelector": {"matchExpressions": [{"key": names.SANDBOX, "operator": "DoesNotExist"}]},
                        }
                    ]
                }
            ],
        },
    }


PORTS_LISTED = 64  # a wider range of an egress rule needs endPort (Kubernetes 1.25 and later)


def egress_rules(policy: NetworkPolicy) -> list[dict[str, Any]]:
    """A NetworkPolicy's ``egress`` for one sandbox's policy: every destination (``enabled``),
    else one rule per allowlisted range and ports (none: nothing beyond the namespace's deny)."""
    if policy.mode == "enabled":
        return [{}]
    rules = []
    for rule in policy.allow:
        if rule.port_end - rule.port_start < PORTS_LISTED:
            # One entry a port: endPort is stable only since Kubernetes 1.25, and an older API
            # server drops it without a word (the range would shrink to its first port).
            ports = [{"protocol": rule.protocol, "port": port} for port in range(rule.port_start, rule.port_end + 1)]
        else:
            ports = [{"protocol": rule.protocol, "port": rule.port_start, "endPort": rule.port_end}]
        rules.append({"to": [{"ipBlock": {"cidr": rule.cidr}}], "ports": ports})
    return rules


def allow_egress_policy(name: str, uid: str | None, policy: NetworkPolicy = ONLINE) -> dict[str, Any]:
    """One sandbox pod's own egress policy (all egress as created with ``network="on"``, or what
    ``set_network`` asked), owned by the pod (the garbage collector deletes it with the pod;
    the adapter deletes it too, and reap removes orphans)."""
    metadata: dict[str, Any] = {
        "name": allow_policy_name(name),
        "labels": {names.SANDBOX: name, names.POLICY: "allow-egress"},
    }
    if uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}]
    return {
        "apiVersion": NETWORKING,
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {"matchLabels": {names.SANDBOX: name}},
            "policyTypes": ["Egress"],
            "egress": egress_rules(policy),
        },
    }


def allow_policy_name(pod: str) -> str:
    return f"{pod}-egress"

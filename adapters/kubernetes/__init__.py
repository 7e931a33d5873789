"""The kubernetes adapter: one pod per sandbox, driven over one long-lived exec websocket.

The package, bottom up (each module imports only those above it):

* ``api``: configuration, and requests under one gate with retries and pagination;
* ``config``: ``KubernetesConfig``, the adapter's options as a checked struct;
* ``manifests``: pure functions: the pod, its labels, the namespace, the NetworkPolicies;
* ``watch``: the pod informer (given the api) and ``pod_verdict``;
* ``relay``: the relay program each pod runs, its entry and its secret (pure);
* ``transport``: how a pod is reached (``Transport``; ``ExecTransport``: exec websockets);
* ``podip``: ``PodIpTransport``, the relay over the pod IP with exec websockets as fallback;
* ``containerd_layer``, ``containerd_image``: a container's file system as an image in its
  node's containerd (``ctr``, GNU tar);
* ``snapshot``: the snapshot store and the tar-of-the-work-dir method; ``forks``: which
  method an adapter uses;
* ``attach``: checking a pod of a gone controller for a new session; ``reap``: removing
  abandoned pods and their policies (both given the api and the transport, not the adapter);
* ``adapter``: ``KubernetesAdapter``, which ties them to the core's container shell.

Layout on the cluster. Every sandbox of a run is a pod in one namespace (``orchard`` by
default; created if missing). The namespace gets one NetworkPolicy, created once, that
denies all egress of every sandbox pod in it (selector: label ``orchard.sandbox`` exists);
a sandbox whose spec says ``network="on"`` gets its own policy allowing egress for that pod
alone (NetworkPolicies add up). Each pod:

* runs the image with the spec's pull policy (missing -> IfNotPresent, never -> Never,
  always -> Always), cpu/memory as requests and limits, the spec's env and labels, plus
  ``orchard.owner``, ``orchard.run``, ``orchard.expires`` (epoch seconds),
  ``orchard.controller`` (``<host>.<pid>.<process start time>``) and ``orchard.sandbox``;
* has ``activeDeadlineSeconds`` = TTL (the kubelet kills it even if nobody else does),
  ``automountServiceAccountToken: false``, ``enableServiceLinks: false`` and
  ``shareProcessNamespace: true`` (the pause container is PID 1 and reaps the zombies of
  commands);
* drops every capability (the shell protocol needs none), sets
  ``allowPrivilegeEscalation: false`` (no-new-privileges) and the runtime's default seccomp
  profile. ``spec.pids`` is NOT enforced per sandbox: Kubernetes limits pids per pod only
  node-wide (the kubelet's ``--pod-max-pids``; the CI cluster sets 1024), which ``doctor``
  says;
* images that ``orchard-async images build`` makes are on no registry: with pull "missing"
  they are never pulled (``Never``), and one that is not on the node is an ``ImageMissing``
  (a ConfigError naming the build command), remembered per image;
* runs as its main process a self-destruct timer (``sleep``): it waits the attach grace,
  and goes on to the rest of the TTL only if a shell attached (a controller killed between
  creating the pod and attaching leaves nothing running for long).

Readiness comes from ONE watch per adapter (an informer: pod phase, container states and
scheduling conditions in memory; reconnects with backoff, resumes from the last
resourceVersion, relists on 410 Gone). ``create`` returns when the pod is Running and its
shell answers. Image pull failures, container start errors and crash loops fail the create
at once; an unschedulable pod fails at the create timeout; either way the error carries the
pod's waiting message and latest warning event, and the pod is deleted.

The hot path is the core's shell-session protocol (orchard_async.kit.shell) over one exec
websocket per sandbox (``sh -s``, kubernetes-asyncio's ``WsApiClient``): one frame per
command, no new websocket. Files and patches are commands on the same session. A timeout
interrupts the shell with a second, short exec (``kill -USR1 <pid>``). The transport is a
small interface (``Transport``). With ``pod_ip`` (the default) it is ``PodIpTransport``: the
same streams over direct TCP connections to a relay in the pod (``relay``, ``podip``), which
keep working while the API server is down, with the exec websocket as the per-pod fallback. The exec's ``sh`` is wrapped so that when the
websocket closes (the controller died, even by SIGKILL) every process in the pod is killed
and the pod ends. Its object stays (phase Failed), and a pod whose shell never attached
waits its attach grace: the adapter's guardian (``guardian``, a process of its own started on
the first create) deletes a dead controller's pods, all but those with a reattach grace
still running (those once they have ended).

Control-plane load: API calls go through one gate (``max_api`` at once), each attempt under
a timeout, retried with exponential backoff and jitter on 429 (honouring Retry-After), 5xx
and connection errors; creates in flight are bounded by ``max_creating``.

Cleanup: ``sandbox.close()`` deletes the pod with grace 0 and background propagation (one API call;
the kubelet tears the containers down after). ``reap`` lists orchard pods by label and
removes those whose TTL passed, that ended, or whose controller process is dead (when it ran
on this host); a failed list raises before anything is deleted.

Forks (``snapshot``): the container's whole file system imported as an image into its node's
containerd where the controller reaches it (forks run it with pull ``Never``), else the work
dir as a tar kept by the controller, streamed into each fork before its create returns.

Config: ``kubeconfig=`` or ``KUBECONFIG`` or ``~/.kube/config`` (``context=`` or
``ORCHARD_K8S_CONTEXT`` selects a context), else the in-cluster service account.
Uses only core/v1 and networking.k8s.io/v1 (Kubernetes 1.20 and later).
"""

from __future__ import annotations

from orchard_async.adapters.kubernetes.adapter import KubernetesAdapter
from orchard_async.adapters.kubernetes.api import ApiError, KubeApi
from orchard_async.adapters.kubernetes.config import KubernetesConfig
from orchard_async.adapters.kubernetes.manifests import (
    PodSettings,
    allow_egress_policy,
    deny_egress_policy,
    pod_manifest,
    sandbox_labels,
)
from orchard_async.adapters.kubernetes.podip import PodIpTransport, RelayRefused, connect_relay
from orchard_async.adapters.kubernetes.transport import ExecTransport, PodRef, Transport
from orchard_async.adapters.kubernetes.watch import PodInformer, PodState, pod_state, pod_verdict

__all__ = [
    "ApiError",
    "ExecTransport",
    "KubeApi",
    "KubernetesAdapter",
    "KubernetesConfig",
    "PodInformer",
    "PodIpTransport",
    "PodRef",
    "PodSettings",
    "PodState",
    "RelayRefused",
    "Transport",
    "allow_egress_policy",
    "connect_relay",
    "deny_egress_policy",
    "pod_manifest",
    "pod_state",
    "pod_verdict",
    "sandbox_labels",
]

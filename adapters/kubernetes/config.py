"""The kubernetes adapter's options (``--adapter-options`` JSON in the CLI), checked as they
are converted: a wrong type or an out-of-range number is a one-line ConfigError."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from orchard_async.adapters.kubernetes.api import API_RETRY_FOR, API_TIMEOUT
from orchard_async.adapters.kubernetes.relay import RELAY_PORT
from orchard_async.images.build import EGRESS_IMAGE
from orchard_async.types import DEFAULT_OUTPUT_CAP

ATTACH_GRACE = 120.0  # the timer's wait for a shell before the pod ends itself

Positive = Annotated[float, msgspec.Meta(gt=0)]
AtLeastOne = Annotated[int, msgspec.Meta(ge=1)]


class KubernetesConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    image: str | None = None  # default image when a spec names none (else ORCHARD_K8S_IMAGE, else local/busybox:1)
    namespace: str | None = None  # where the pods live (else ORCHARD_K8S_NAMESPACE, else "orchard"); made if missing
    context: str | None = None  # kubeconfig context (else ORCHARD_K8S_CONTEXT, else the current context)
    kubeconfig: str | None = None  # kubeconfig path(s) (else KUBECONFIG, else ~/.kube/config, else in-cluster)
    in_cluster: bool = False  # use the pod's service account even when a kubeconfig exists
    run_id: str | None = None  # lease label (default: a fresh run id)
    owner: str | None = None  # lease label (default: user@host)
    node_selector: dict[str, str] = {}  # {label: value} for every pod
    tolerations: list[dict[str, Any]] = []  # core/v1 Toleration objects for every pod
    runtime_class: str | None = None  # runtimeClassName (e.g. gvisor, kata) for stronger isolation
    gpu_runtime_class: str | None = None  # runtimeClassName of sandboxes with spec.gpus (e.g. nvidia)
    priority_class: str | None = None  # priorityClassName
    # create the namespace's deny-egress policy and per-sandbox allow policies (False where an
    # admin manages policies)
    manage_network_policies: bool = True
    # the packet filter in each sandbox pod's network namespace (egress.py), which holds whatever the
    # CNI does: "auto" where a node of the cluster reports egress_image among its images (else
    # NetworkPolicies alone, as `doctor` says), "on" always (a create fails without the image), "off" never
    egress_filter: Literal["auto", "on", "off"] = "auto"
    # that filter's image: iptables (nf_tables) and sh (`orchard-async images build orchard/egress:bookworm
    # --adapter kubernetes` imports it into a one-node cluster's containerd)
    egress_image: str = EGRESS_IMAGE
    read_only: bool = False  # read-only root file system; the workdir and the control dir get emptyDirs
    exit_with_shell: bool = True  # end the pod when its exec websocket closes
    max_creating: AtLeastOne = 32  # creates in flight at once (pod POST to shell answering)
    max_api: AtLeastOne = 32  # API calls in flight at once
    api_qps: Positive | None = None  # requests a second, client-go style (default: unlimited; max_api bounds)
    api_burst: AtLeastOne | None = None  # the QPS bucket's size (default: api_qps)
    api_timeout: Positive = API_TIMEOUT  # seconds one attempt of one API call may take
    api_retry_for: Annotated[float, msgspec.Meta(ge=0)] = API_RETRY_FOR  # seconds one call retries 429/5xx/errors
    attach_grace: Positive = ATTACH_GRACE  # seconds a pod waits for its shell before ending itself
    # seconds a pod outlives its controller, for another to ``attach`` (0: it ends at once; needs
    # exit_with_shell). What ``orchard-async serve`` uses to re-adopt its sandboxes after a restart.
    reattach_grace: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 0.0
    # hollow (kubemark) nodes: create -> Running -> delete with no shell (nothing can be exec'd);
    # pods go to nodes labelled and tainted orchard.hollow=true (scripts/k8s-hollow-nodes.sh)
    control_plane_only: bool = False
    # commands over a direct TCP connection to a relay in each pod (its pod IP; podip.py), the exec
    # websocket where the pod IP does not answer or the image has no python3 for the relay
    pod_ip: bool = True
    relay_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = RELAY_PORT  # the relay's port in each pod
    # where snapshots (their leases, and the work-dir tars: snapshot.py) are kept on the controller (else
    # ORCHARD_K8S_SNAPSHOT_DIR, else ~/.cache/orchard-async/kubernetes-snapshots)
    snapshot_dir: str | None = None
    # how snapshots are taken (snapshot.py): "auto" imports the sandbox's file system into its
    # node's containerd where the controller reaches it, else tars the work dir; "containerd"
    # (a ConfigError where it cannot) or "tar" force one
    snapshot_method: Literal["auto", "containerd", "tar"] = "auto"
    containerd_address: str | None = None  # the node's containerd socket (else CONTAINERD_ADDRESS, else the default)
    # a registry to push snapshot images to (multi-node clusters): not built, a ConfigError when set
    snapshot_registry: str | None = None
    output_cap: Annotated[int, msgspec.Meta(ge=0)] = DEFAULT_OUTPUT_CAP  # bytes kept per output stream

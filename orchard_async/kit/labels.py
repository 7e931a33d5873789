"""Every ``orchard.*`` label and annotation, and the controller's identity, for all adapters.

A sandbox carries lease labels (owner, run, expiry, controller) so that ``reap`` (anyone's,
later) can tell a live run's sandboxes from a dead one's without asking the run. The
controller identity names one process, not a PID the kernel may have reused since: it
includes the process's kernel start time.

Two spellings of the identity exist because backends accept different label values:

* ``controller_id()``: ``<host>:<pid>:<start time>``, a label where any string goes
  (docker, local); ``controller_alive`` reads it back.
* ``controller_identity()`` as JSON in an annotation (host, PID namespace, pid, start
  time) with ``controller_label`` as a valid Kubernetes label value
  (``<host>.<pid>.<start>``); ``annotated_controller_alive`` reads the annotation back.
"""

from __future__ import annotations

import json
import os
import re
import socket

from orchard_async.kit import procfs

# -- lease labels: on every sandbox -------------------------------------------------------------
OWNER = "orchard.owner"  # user@host that created it
RUN = "orchard.run"  # the adapter's run id
EXPIRES = "orchard.expires"  # epoch seconds: its TTL's end
CONTROLLER = "orchard.controller"  # the controller process (controller_id or controller_label)
SANDBOX = "orchard.sandbox"  # kubernetes: the pod's own name (network policies select on it)
REATTACH = "orchard.reattach"  # seconds it outlives its controller for another to attach (container_reattach)

# -- what the core and bench put into SandboxSpec.labels -----------------------------------------
EPISODE = "orchard.episode"
ATTEMPT = "orchard.attempt"
ROLE = "orchard.role"  # "scorer" for a separate grading sandbox
BENCH = "orchard.bench"
SERVE_KEY = "orchard.serve.key"  # the service's tenant
SERVE_ID = "orchard.serve.id"
SERVE_NAME = "orchard.serve.name"  # the service instance that made it (``serve --name``): what a restart re-adopts

# -- kubernetes objects other than sandbox pods ---------------------------------------------------
POLICY = "orchard.policy"  # on NetworkPolicies: deny-egress | allow-egress
NAMESPACE = "orchard.namespace"  # on a namespace the adapter created

# -- kubernetes annotations (any string fits) -----------------------------------------------------
CONTROLLER_ANNOTATION = "orchard/controller"  # controller_identity() as JSON
OWNER_ANNOTATION = "orchard/owner"  # the owner unshortened

_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]")


def lease_labels(*, owner: str, run: str, expires_at: float, controller: str) -> dict[str, str]:
    """The lease labels of one sandbox (the caller adds the spec's own labels under them)."""
    return {OWNER: owner, RUN: run, EXPIRES: str(int(expires_at)), CONTROLLER: controller}


def expiry(labels: dict[str, str]) -> float:
    """A sandbox's expiry from its labels; 0 (long expired) when missing or garbled."""
    try:
        return float(labels.get(EXPIRES, "0"))
    except ValueError:
        return 0.0


def label_value(text: str) -> str:
    """``text`` as a valid Kubernetes label value: [A-Za-z0-9_.-], at most 63, alphanumeric
    ends; other characters become ``_`` and the head is kept."""
    return _LABEL_VALUE_BAD.sub("_", text)[:63].strip("_.-")


def episode_label(episode_id: str) -> str:
    """The ``EPISODE`` label of an episode's sandbox, by the same rule as ``label_value``
    except that other characters become ``-`` and the tail is kept (where the ids of a
    task's episodes differ), "episode" when nothing is left. Recipes find an episode's
    sandbox by it."""
    return _LABEL_VALUE_BAD.sub("-", episode_id)[-63:].strip("_.-") or "episode"


# -- the controller's identity ------------------------------------------------------------------


def controller_id() -> str:
    """This process as ``<host>:<pid>:<start time>``."""
    return f"{socket.gethostname()}:{os.getpid()}:{procfs.start_ticks(os.getpid())}"


def controller_alive(label: str) -> bool | None:
    """Is the process a ``controller_id`` label names alive? None when this host cannot tell
    (the label names another host, or is malformed): then only the sandbox's expiry decides."""
    host, _, rest = label.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    return procfs.start_ticks(int(pid)) == start


def controller_identity() -> dict[str, str]:
    """This process as reap sees it: host, PID namespace, pid and start time."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "pidns": procfs.pid_namespace(),
        "pid": str(pid),
        "start": procfs.start_ticks(pid) or "0",
    }


def controller_label(identity: dict[str, str]) -> str:
    """``<host>.<pid>.<start time>`` as a label value (the host shortened to fit)."""
    tail = f".{identity['pid']}.{identity['start']}"
    host = label_value(identity["host"])[: 63 - len(tail)].rstrip("-_.") or "host"
    return host + tail


def annotated_controller_alive(annotation: str | None) -> bool | None:
    """Is the controller named by a ``CONTROLLER_ANNOTATION`` (``controller_identity`` as
    JSON) alive? None when this process cannot tell (another host or PID namespace)."""
    try:
        ident = json.loads(annotation or "")
        host, pidns, pid, start = ident["host"], ident["pidns"], int(ident["pid"]), ident["start"]
    except (ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname() or pidns != procfs.pid_namespace():
        return None
    return procfs.start_ticks(pid) == start

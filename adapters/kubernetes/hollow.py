"""Control-plane-only mode (``control_plane_only=True``): sandboxes on kubemark hollow nodes
(scripts/k8s-hollow-nodes.sh), whose pods reach Running with no process behind them. A
sandbox is created (pod POST, the watch sees it Running) and deleted like any other, but has
no shell: every command raises. It measures what a large cluster costs the controller and
the API server, never command latency; outputs say so (``CONTROL_PLANE_LABEL``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, NoReturn

from orchard_async.adapters.kubernetes.watch import PodState, pod_state, pod_verdict
from orchard_async.errors import ConfigError

HOLLOW_LABEL = "orchard.hollow"  # the node label and taint key k8s-hollow-nodes.sh sets
CONTROL_PLANE_LABEL = "control-plane only (kubemark hollow nodes: no exec)"
HOLLOW_TOLERATION = {"key": HOLLOW_LABEL, "operator": "Exists", "effect": "NoSchedule"}


def hollow_placement(
    node_selector: dict[str, str], tolerations: list[dict[str, Any]]
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The node selector and tolerations that put a pod on a hollow node (and only there)."""
    return {**node_selector, HOLLOW_LABEL: "true"}, [*tolerations, HOLLOW_TOLERATION]


def hollow_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """A pod for a hollow node: its fake runtime has no images and "pulls" any at once, so
    the pull policy that keeps locally built images off registries (Never) would fail it."""
    for container in manifest["spec"]["containers"]:
        container["imagePullPolicy"] = "IfNotPresent"
    return manifest


def hollow_verdict(pod: dict[str, Any] | PodState) -> tuple[str, str]:
    """``pod_verdict`` for a hollow node: its fake runtime ends containers after a few seconds
    (there is no process), and its kubelet posts status at a few requests a second, so the
    first status the watch sees can already say "terminated". The pod counts as started
    (ready) once the runtime has started its container, whatever came after."""
    pod = pod_state(pod)
    state = pod.container
    if state is not None and (
        (state.running and state.running.startedAt) or (state.terminated and state.terminated.startedAt)
    ):
        return "ready", "started on a hollow node"
    return pod_verdict(pod)


class ControlPlaneSandbox:
    """A pod on a hollow node: id, labels, and a close that deletes the pod; nothing runs."""

    workdir = "/"

    def __init__(self, name: str, labels: dict[str, str], expires_at: float, teardown: Callable[[], Awaitable[None]]):
        self.id = name
        self.labels = labels
        self.expires_at = expires_at
        self._teardown = teardown
        self.closed = False

    def _refuse(self, *_: Any, **__: Any) -> NoReturn:
        raise ConfigError(
            f"sandbox {self.id} is a control-plane-only pod on a hollow node: nothing can run in it "
            "(drop control_plane_only to exec)"
        )

    async def exec(self, cmd: str, **_: Any) -> Any:
        self._refuse()

    async def read_file(self, path: str) -> bytes:
        self._refuse()

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        self._refuse()

    async def list_dir(self, path: str = ".") -> list[Any]:
        self._refuse()

    async def apply_patch(self, patch: str | bytes, *, cwd: str | None = None) -> Any:
        self._refuse()

    def session(self) -> AbstractAsyncContextManager[Any]:
        self._refuse()

    async def open_stream(self, argv: Sequence[str]) -> Any:
        self._refuse()

    async def connect(self, port: int) -> Any:
        self._refuse()

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self._teardown()

    async def __aenter__(self) -> ControlPlaneSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

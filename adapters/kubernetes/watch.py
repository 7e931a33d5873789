"""The pod watch: one informer per adapter keeps its pods in memory (phase, container states,
scheduling conditions), and ``pod_verdict`` reads a pod being created as ready, pending or
failed. The informer is given the API (``KubeApi``), not the adapter."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec

from orchard_async.adapters.kubernetes.api import ApiError, KubeApi, api_error
from orchard_async.adapters.kubernetes.egress import EGRESS_CONTAINER
from orchard_async.adapters.kubernetes.manifests import CONTAINER
from orchard_async.kit.retry import Backoff

WATCH_SECONDS = 240  # server-side timeout of one watch request; then it is resumed
RECONNECT_BACKOFF = Backoff(0.2, cap=5.0, jitter=(0.5, 1.5))  # after a watch or list that failed

# container waiting reasons that no amount of waiting fixes: the create fails at once
EGRESS_FAILED = "the egress filter's container failed: "
FATAL_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
    "PreStartHookError",
    "PostStartHookError",
}


# -- what the watch keeps of a pod ------------------------------------------------------------
#
# The API server sends whole pods (spec, status, managedFields: ~10-20 KB of JSON, several
# times that as Python dicts). The informer keeps one PodState per pod: the fields that
# ``pod_verdict``, ``hollow_verdict`` and the adapter read. Watch events are decoded straight
# into the shapes below (msgspec skips every other field without building it); their field
# names are the API's own (camelCase), so that they decode without renaming.


class _Waiting(msgspec.Struct, gc=False):
    reason: str | None = None
    message: str | None = None


class _Running(msgspec.Struct, gc=False):
    startedAt: str | None = None


class _Terminated(msgspec.Struct, gc=False):
    reason: str | None = None
    message: str | None = None
    exitCode: int | None = None
    startedAt: str | None = None


class _ContainerState(msgspec.Struct, gc=False):
    waiting: _Waiting | None = None
    running: _Running | None = None
    terminated: _Terminated | None = None


class _ContainerStatus(msgspec.Struct, gc=False):
    name: str | None = None
    state: _ContainerState | None = None
    containerID: str | None = None


class _Condition(msgspec.Struct, gc=False):
    type: str | None = None
    status: str | None = None
    reason: str | None = None
    message: str | None = None


class _Status(msgspec.Struct, gc=False):
    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    podIP: str | None = None
    containerStatuses: list[_ContainerStatus] | None = None
    conditions: list[_Condition] | None = None


class _Meta(msgspec.Struct, gc=False):
    name: str = ""
    resourceVersion: str = ""


class _Spec(msgspec.Struct, gc=False):
    nodeName: str | None = None


class _Pod(msgspec.Struct, gc=False):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec | None = None
    status: _Status | None = None


class _Event(msgspec.Struct, gc=False):
    type: str = ""
    object: msgspec.Raw = msgspec.Raw(b"{}")  # a pod, or a Status for ERROR: decoded by type


class _ErrorStatus(msgspec.Struct, gc=False):
    code: int | None = None
    reason: str | None = None
    message: str | None = None


class PodState(msgspec.Struct, frozen=True, gc=False):
    """What the adapter reads of a pod: its phase and the sandbox container's state (see
    ``pod_verdict``), its IP and node. One small object per pod instead of the pod."""

    name: str = ""
    phase: str | None = None
    reason: str | None = None  # the pod's (Failed/Succeeded: why)
    message: str | None = None
    pod_ip: str | None = None
    node: str | None = None
    container: _ContainerState | None = None  # the sandbox container's (None: not reported yet)
    container_id: str | None = None  # the sandbox container's "<runtime>://<id>" (forks.py)
    unscheduled: _Condition | None = None  # a PodScheduled=False condition, if any
    egress: _ContainerState | None = None  # the egress filter's container's (egress.py), if the pod has one


_decode_event = msgspec.json.Decoder(_Event).decode
_decode_pod = msgspec.json.Decoder(_Pod).decode
_decode_error = msgspec.json.Decoder(_ErrorStatus).decode


def _state_of(pod: _Pod) -> PodState:
    status = pod.status or _Status()
    sandbox = next((c for c in status.containerStatuses or [] if c.name == CONTAINER), None)
    unscheduled = next((c for c in status.conditions or [] if c.type == "PodScheduled" and c.status == "False"), None)
    egress = next((c for c in status.containerStatuses or [] if c.name == EGRESS_CONTAINER), None)
    return PodState(
        name=pod.metadata.name,
        phase=status.phase,
        reason=status.reason,
        message=status.message,
        pod_ip=status.podIP,
        node=pod.spec.nodeName if pod.spec else None,
        container=(sandbox.state or _ContainerState()) if sandbox else None,
        container_id=sandbox.containerID if sandbox else None,
        unscheduled=unscheduled,
        egress=(egress.state or _ContainerState()) if egress else None,
    )


def pod_state(pod: dict[str, Any] | PodState) -> PodState:
    """The PodState of a pod as the API returns it (a dict from a list or GET)."""
    if isinstance(pod, PodState):
        return pod
    return _state_of(msgspec.convert(pod, _Pod))


def pod_verdict(pod: dict[str, Any] | PodState) -> tuple[str, str]:
    """("ready" | "pending" | "failed", why) for a pod being created."""
    pod = pod_state(pod)
    phase = pod.phase or "Pending"
    state = pod.container or _ContainerState()
    # The filter's container: a failure there (its image, its hook) is said as the filter's,
    # never as the sandbox image's; a pod whose filter does not run is never ready.
    egress = pod.egress or _ContainerState()
    if egress.waiting is not None and (egress.waiting.reason or "") in FATAL_WAITING:
        return "failed", f"{EGRESS_FAILED}{egress.waiting.reason}: {egress.waiting.message or ''}".rstrip(": ")
    if egress.terminated is not None:
        ended = egress.terminated
        if ended.exitCode == 0:  # its watch ended: the sandbox container's processes were gone (or never came)
            waiting = state.waiting
            if waiting is not None and waiting.reason:  # never came: why (its image, say) is the sandbox's own
                return "failed", f"{waiting.reason}: {waiting.message or ''}".rstrip(": ")
            why = "the sandbox container's processes ended before the pod was ready"
            term = state.terminated
            if term is not None and term != _Terminated():  # what the kubelet says of its end
                said = ", ".join(part for part in (term.reason, term.message) if part)
                why += f" ({said + ', ' if said else ''}exit code {term.exitCode})"
            return "failed", why
        return "failed", f"{EGRESS_FAILED}{ended.reason}: {ended.message or ''} (exit code {ended.exitCode})"
    if phase in ("Failed", "Succeeded"):
        term = state.terminated
        if term is not None and term == _Terminated():
            term = None  # reported empty: nothing to add
        why = pod.reason or (term.reason if term else None) or phase
        message = pod.message or (term.message if term else None) or ""
        if term:
            message = f"{message} (container exit code {term.exitCode})".strip()
        return "failed", f"pod {phase.lower()}: {why}: {message}".rstrip(": ")
    if state.waiting is not None:
        reason = state.waiting.reason or ""
        if reason in FATAL_WAITING:
            return "failed", f"{reason}: {state.waiting.message or ''}".rstrip(": ")
        if reason:
            return "pending", f"{reason}: {state.waiting.message or ''}".rstrip(": ")
    if state.terminated is not None:
        term = state.terminated
        return "failed", f"container ended: {term.reason}: {term.message or ''} (exit code {term.exitCode})"
    if phase == "Running" and state.running is not None and (pod.egress is None or egress.running is not None):
        return "ready", "running"
    if pod.unscheduled is not None:
        cond = pod.unscheduled
        return "pending", f"{cond.reason or 'not scheduled'}: {cond.message or ''}".rstrip(": ")
    return "pending", f"phase {phase}"


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): relist."""


class PodInformer:
    """One watch over the pods a label selector picks, kept in memory (a PodState by name).

    ``run`` is its loop, for a task group (the adapter's background): list, then watch from the list's resourceVersion; on a clean
    end of the watch resume from the last version seen, on an error reconnect with backoff,
    on 410 Gone relist. Every change to a pod wakes whoever waits on it; a relist wakes
    everyone (changes during the outage were not seen one by one).
    """

    def __init__(self, api: KubeApi, selector: str):
        self._api = api
        self.selector = selector
        self.pods: dict[str, PodState] = {}
        self.creating: set[str] = set()  # pods whose create waits on this watch
        self.gone: set[str] = set()  # of those, deleted while we watched: their create fails
        self._waiters: dict[str, anyio.Event] = {}
        self.synced = anyio.Event()
        self.connected = False
        self.lists = 0
        self.watches = 0
        self.errors = 0
        self.gone_410 = 0
        self.events = 0  # watch events received (bookmarks included)
        self.last_error = ""

    def changed(self, name: str) -> anyio.Event:
        """An event set at the next change of pod ``name`` (or any relist)."""
        event = self._waiters.get(name)
        if event is None:
            event = self._waiters[name] = anyio.Event()
        return event

    def _notify(self, name: str) -> None:
        event = self._waiters.pop(name, None)
        if event is not None:
            event.set()

    def _notify_all(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for event in waiters.values():
            event.set()

    async def run(self) -> None:
        """Keep the pods in memory until cancelled (it never returns by itself)."""
        version: str | None = None
        failures = 0  # since the last watch that ended well
        while True:
            try:
                if version is None:
                    version = await self._relist()
                version = await self._watch(version)
                failures = 0
            except _Gone:
                self.gone_410 += 1
                version = None
            except Exception as exc:
                self.connected = False
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                await anyio.sleep(RECONNECT_BACKOFF.delay(failures))
                failures += 1

    async def _relist(self) -> str:
        pods: dict[str, PodState] = {}
        version, token = "", ""
        while True:
            page = await self._api.list_page(self._api.path("pods"), self.selector, "pod list", token)
            for pod in page.get("items") or []:
                pods[pod["metadata"]["name"]] = pod_state(pod)
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            version = meta.get("resourceVersion") or version
            if not token:
                break
        for name in set(self.pods) - set(pods):
            if name in self.creating:
                self.gone.add(name)
        self.pods = pods
        self.lists += 1
        self.connected = True
        self.synced.set()
        self._notify_all()
        return version

    async def _watch(self, version: str) -> str:
        query = [
            ("labelSelector", self.selector),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", version),
            ("timeoutSeconds", str(WATCH_SECONDS)),
        ]
        # the connect is bounded by api_timeout; the stream by the server's timeout plus slack
        with anyio.fail_after(self._api.api_timeout):
            response = await self._api.open("GET", self._api.path("pods"), query=query, timeout=WATCH_SECONDS + 60)
        self.watches += 1
        self.connected = True
        try:
            if response.status == 410:
                raise _Gone()
            if response.status >= 300:
                raise await api_error(response)
            while True:
                line = await response.content.readline()
                if not line:
                    return version  # the server ended the watch: resume from here
                version = self._apply(line, version)
        finally:
            response.release()

    def _apply(self, line: bytes, version: str) -> str:
        """One watch event (a line of JSON) into memory; the resourceVersion to resume from after it."""
        event = _decode_event(line)
        self.events += 1
        if event.type == "ERROR":
            error = _decode_error(event.object)
            if error.code == 410:
                raise _Gone()
            raise ApiError(int(error.code or 500), error.reason or "", error.message or "")
        pod = _decode_pod(event.object)
        version = pod.metadata.resourceVersion or version
        if event.type == "BOOKMARK":
            return version
        name = pod.metadata.name
        if event.type == "DELETED":
            self.pods.pop(name, None)
            if name in self.creating:
                self.gone.add(name)
        else:
            self.pods[name] = _state_of(pod)
        self._notify(name)
        return version

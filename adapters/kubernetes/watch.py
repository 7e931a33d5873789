"""The pod watch: one informer per adapter keeps its pods in memory (phase, container states,
scheduling conditions), and ``pod_verdict`` reads a pod being created as ready, pending or
failed. The informer is given the API (``KubeApi``), not the adapter."""

from __future__ import annotations

import json
import random
from typing import Any

import anyio

from .api import ApiError, KubeApi, api_error
from .manifests import CONTAINER

WATCH_SECONDS = 240  # server-side timeout of one watch request; then it is resumed

# container waiting reasons that no amount of waiting fixes: the create fails at once
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


def pod_verdict(pod: dict[str, Any]) -> tuple[str, str]:
    """("ready" | "pending" | "failed", why) for a pod being created."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    containers = {c.get("name"): c for c in status.get("containerStatuses") or []}
    state = (containers.get(CONTAINER) or {}).get("state") or {}
    if phase in ("Failed", "Succeeded"):
        term = state.get("terminated") or {}
        why = status.get("reason") or term.get("reason") or phase
        message = status.get("message") or term.get("message") or ""
        if term:
            message = f"{message} (container exit code {term.get('exitCode')})".strip()
        return "failed", f"pod {phase.lower()}: {why}: {message}".rstrip(": ")
    if "waiting" in state:
        waiting = state["waiting"] or {}
        reason = waiting.get("reason") or ""
        if reason in FATAL_WAITING:
            return "failed", f"{reason}: {waiting.get('message') or ''}".rstrip(": ")
        if reason:
            return "pending", f"{reason}: {waiting.get('message') or ''}".rstrip(": ")
    if "terminated" in state:
        term = state["terminated"] or {}
        return (
            "failed",
            f"container ended: {term.get('reason')}: {term.get('message') or ''} (exit code {term.get('exitCode')})",
        )
    if phase == "Running" and "running" in state:
        return "ready", "running"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return "pending", f"{cond.get('reason') or 'not scheduled'}: {cond.get('message') or ''}".rstrip(": ")
    return "pending", f"phase {phase}"


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): relist."""


class PodInformer:
    """One watch over the pods a label selector picks, kept in memory (pod dicts by name).

    ``run`` is its loop, for a task group (the adapter's background): list, then watch from the list's resourceVersion; on a clean
    end of the watch resume from the last version seen, on an error reconnect with backoff,
    on 410 Gone relist. Every change to a pod wakes whoever waits on it; a relist wakes
    everyone (changes during the outage were not seen one by one).
    """

    def __init__(self, api: KubeApi, selector: str):
        self._api = api
        self.selector = selector
        self.pods: dict[str, dict[str, Any]] = {}
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
        backoff = 0.2
        while True:
            try:
                if version is None:
                    version = await self._relist()
                version = await self._watch(version)
                backoff = 0.2
            except _Gone:
                self.gone_410 += 1
                version = None
            except Exception as exc:  # noqa: BLE001 - any failure of the connection: reconnect
                self.connected = False
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                await anyio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 5.0)

    async def _relist(self) -> str:
        pods: dict[str, dict[str, Any]] = {}
        version, token = "", ""
        while True:
            page = await self._api.list_page(self._api.path("pods"), self.selector, "pod list", token)
            for pod in page.get("items") or []:
                pods[pod["metadata"]["name"]] = pod
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
                version = self._apply(json.loads(line), version)
        finally:
            response.release()

    def _apply(self, event: dict[str, Any], version: str) -> str:
        """One watch event into memory; the resourceVersion to resume from after it."""
        kind, obj = event.get("type"), event.get("object") or {}
        self.events += 1
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone()
            raise ApiError(int(obj.get("code") or 500), obj.get("reason") or "", obj.get("message") or "")
        version = (obj.get("metadata") or {}).get("resourceVersion") or version
        if kind == "BOOKMARK":
            return version
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.pods.pop(name, None)
            if name in self.creating:
                self.gone.add(name)
        else:
            self.pods[name] = obj
        self._notify(name)
        return version

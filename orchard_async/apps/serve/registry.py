"""The sandboxes the service holds: who owns each, its state, its lifetime.

A sandbox's public id is the caller's (or one made up here) and lives in its tenant's
namespace: two keys may both name a sandbox ``box-1``, and neither can learn that the
other's exists (another key's id answers 404, exactly like an id nobody uses).

Creation runs in the background: ``POST /sandboxes`` answers ``pending`` at once and
``/wait`` blocks until the adapter's ``create`` returns. Lifetime: every sandbox ends at
its TTL (``timeout``) or after ``idle_timeout`` seconds without a call; ``reap_once``
removes both, and the adapter's own TTL kills the sandbox even if this process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import time
import typing
import uuid
from typing import Any

import msgspec

import orchard_async as oa
from orchard_async.apps.serve import adopt
from orchard_async.apps.serve.keys import CreateRate, Tenant
from orchard_async.apps.serve.lane import close_lane
from orchard_async.apps.serve.metrics import Metrics
from orchard_async.apps.serve.schema import SANDBOX_ID, ApiError, CreateRequest, parse_cpu
from orchard_async.capabilities import FileRoot
from orchard_async.kit.labels import label_value

log = logging.getLogger("orchard_async.apps.serve")

RETRY = {"Retry-After": "1"}
ORCHARD_WORKDIR = "/workspace"  # where Orchard's clients put their files; mapped onto the sandbox's workdir
TENANT_LABEL = "orchard.serve.key"
ID_LABEL = "orchard.serve.id"
NAME_LABEL = "orchard.serve.name"


class Box:
    """One sandbox as the service knows it."""

    def __init__(self, public_id: str, tenant: Tenant, request: CreateRequest, ttl: float, idle_timeout: float):
        self.id = public_id
        self.tenant = tenant
        self.request = request
        self.status = "pending"  # pending -> ready | failed
        self.status_message = ""
        self.sandbox: oa.Sandbox | None = None
        self.created_at = time.time()
        self.expires_at = self.created_at + ttl
        self.ttl = ttl
        self.idle_timeout = idle_timeout
        self.last_used = time.monotonic()
        self.ready = asyncio.Event()  # set when the status leaves pending
        self.lock = asyncio.Lock()  # Orchard runs one sandbox's commands one at a time
        self.deleted = False
        self.sessions: dict[str, tuple[contextlib.AsyncExitStack, oa.Session]] = {}
        self.lane: Any = None  # Orchard commands' bash lane (lane.py): None until opened, False if none
        # Whether its `env` resets signal dispositions (jobs.orchard_script): None until asked.
        self.default_signals: bool | None = None
        self.origin: Any = None  # the connection of the create's caller, until its answer is delivered
        self.adopting = False  # found after a restart; its shell is being re-attached (see adopt.py)
        # Re-adopted after a restart: a job of the run before may have been cut in it (see jobs.py);
        # without its record, the first retried create with its id tells what it was made from.
        self.readopted = False
        self.record_missing = False

    def caller_gone(self) -> bool:
        return self.origin is not None and self.origin.is_closing()

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def expired(self) -> str | None:
        if time.time() >= self.expires_at:
            return "ttl"
        if self.idle_timeout and time.monotonic() - self.last_used >= self.idle_timeout:
            return "idle"
        return None

    def path(self, path: str) -> str:
        """A caller's path inside the sandbox: Orchard's ``/workspace`` is the sandbox's workdir."""
        workdir = self.sandbox.workdir if self.sandbox else ORCHARD_WORKDIR
        if workdir != ORCHARD_WORKDIR and (path == ORCHARD_WORKDIR or path.startswith(ORCHARD_WORKDIR + "/")):
            return posixpath.join(workdir, path[len(ORCHARD_WORKDIR) + 1 :])
        return path

    def describe(self) -> dict[str, Any]:
        request = self.request
        return {
            "sandbox_id": self.id,
            "status": self.status,
            "ready": self.status == "ready",
            "status_message": self.status_message,
            "namespace": self.tenant.name,
            "image": request.image,
            "block_network": request.block_network,
            "cpu": request.cpu,
            "memory": request.memory,
            "timeout": int(self.ttl),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            # extensions: what the remote adapter's Sandbox exposes
            "workdir": self.sandbox.workdir if self.sandbox else None,
            "root": (self.sandbox.root if isinstance(self.sandbox, FileRoot) else "/") if self.sandbox else None,
            "labels": dict(self.sandbox.labels) if self.sandbox else dict(request.labels),
        }


class Registry:
    def __init__(
        self,
        adapter: oa.Adapter,
        metrics: Metrics,
        *,
        max_sandboxes: int,
        default_ttl: float,
        max_ttl: float,
        idle_timeout: float,
        service_name: str = "",
    ):
        self.adapter = adapter
        # on every sandbox's labels, so that a restart of this service finds its sandboxes (adopt.py)
        self.service_name = label_value(service_name)
        # True until a restart's re-adoption has listed the backend: until then an id this
        # service does not know may be one it is about to adopt (503, not 404)
        self.adopting = False
        self.lost: dict[tuple[str, str], str] = {}  # ids a restart could not re-adopt: why
        self.metrics = metrics
        self.max_sandboxes = max_sandboxes
        self.default_ttl = default_ttl
        self.max_ttl = max_ttl
        self.idle_timeout = idle_timeout
        self.boxes: dict[tuple[str, str], Box] = {}
        self.deleted: dict[tuple[str, str], float] = {}  # tombstones: a retried DELETE still answers "deleted"
        self.rate = CreateRate()
        # Creates without a caller's id whose answer has not reached the caller yet, by body:
        # where a client's retry of one finds it (see jobs.py for why a POST can come twice).
        self._unanswered: dict[tuple[str, bytes], Box] = {}
        self._tasks: set[asyncio.Task] = set()

    # -- lookups ---------------------------------------------------------------------------

    def live_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for box in self.boxes.values():
            if box.status != "failed":
                counts[box.tenant.name] = counts.get(box.tenant.name, 0) + 1
        return counts

    def get(self, tenant: Tenant, sandbox_id: str, *, touch: bool = True) -> Box:
        """A sandbox of this tenant. ``touch``: the call uses it, which renews its idle limit
        (a status poll does not: a dashboard must not keep sandboxes alive)."""
        box = self.boxes.get((tenant.name, sandbox_id))
        if box is None:
            self.unknown(tenant, sandbox_id)
        if touch:
            box.touch()
        return box

    def unknown(self, tenant: Tenant, sandbox_id: str) -> typing.NoReturn:
        """The answer for an id this service does not hold: 503 while a restart is still
        listing what to re-adopt, 404 saying why for one it could not, else 404."""
        if self.adopting:
            raise ApiError(503, "the service restarted and is re-adopting its sandboxes; retry", "restarting", RETRY)
        why = self.lost.get((tenant.name, sandbox_id))
        if why is not None:
            raise ApiError(404, f"sandbox {sandbox_id} was lost when the service restarted: {why}", "sandbox_lost")
        raise ApiError(404, f"sandbox {sandbox_id} not found", "unknown_sandbox")

    def ready(self, tenant: Tenant, sandbox_id: str, not_ready_status: int) -> tuple[Box, oa.Sandbox]:
        """A sandbox that can run commands; ``not_ready_status`` is Orchard's answer otherwise
        (404 for exec, 400 for files)."""
        box = self.get(tenant, sandbox_id)
        if box.adopting:  # not an unready sandbox: a ready one whose shell is being re-attached
            raise ApiError(503, f"sandbox {sandbox_id} is being re-adopted after a restart; retry", "restarting", RETRY)
        if box.sandbox is None:
            raise ApiError(not_ready_status, f"sandbox {sandbox_id} is {box.status}, not ready", "not_ready")
        return box, box.sandbox

    # -- create ----------------------------------------------------------------------------

    def spec_of(self, request: CreateRequest, tenant: Tenant, public_id: str) -> tuple[oa.SandboxSpec, float]:
        ttl = float(request.timeout) if request.timeout is not None else self.default_ttl
        if not 0 < ttl <= self.max_ttl:
            raise ApiError(422, f"timeout must be between 1 and {int(self.max_ttl)} seconds, got {request.timeout}")
        try:
            spec = oa.SandboxSpec(
                image=request.image,
                cpu=parse_cpu(request.cpu),
                memory=request.memory,
                pids=request.pids,
                network="none" if request.block_network else "on",
                env=request.env,
                workdir=request.workdir,
                writable_dirs=tuple(request.writable_dirs),
                gpus=request.gpus,
                switch_users=request.switch_users,
                ttl=ttl,
                labels={**request.labels, TENANT_LABEL: tenant.name, ID_LABEL: public_id, **self.name_label()},
            )
        except oa.ConfigError as exc:
            raise ApiError(422, str(exc), "invalid") from None
        return spec, ttl

    def name_label(self) -> dict[str, str]:
        return {NAME_LABEL: self.service_name} if self.service_name else {}

    def create(self, tenant: Tenant, request: CreateRequest, origin: Any = None) -> Box:
        """Start creating a sandbox. A create that repeats one already made with the same id
        and body, or (without an id) one whose caller hung up before its answer came, is the
        client's retry: it gets that sandbox, not a second one."""
        if request.sandbox_id is not None and not SANDBOX_ID.match(request.sandbox_id):
            raise ApiError(422, f"sandbox_id {request.sandbox_id!r}: letters, digits, '.', '_', '-' (at most 100)")
        if self.adopting:  # the quotas count re-adopted sandboxes, and an id may be taken by one
            raise ApiError(503, "the service restarted and is re-adopting its sandboxes; retry", "restarting", RETRY)
        unanswered_key = (tenant.name, msgspec.json.encode(request))
        if request.sandbox_id is None:
            earlier = self._unanswered.get(unanswered_key)
            if earlier is not None and earlier.caller_gone():
                earlier.origin = origin
                return earlier
        public_id = request.sandbox_id or f"sbx-{uuid.uuid4().hex[:16]}"
        existing = self.boxes.get((tenant.name, public_id))
        if existing is not None:
            if existing.adopting:  # its request is known once its record is read back
                raise ApiError(
                    503, f"sandbox {public_id} is being re-adopted after a restart; retry", "restarting", RETRY
                )
            if existing.request == request:
                return existing
            if existing.record_missing:  # owner and id come from its labels; the retry says the rest
                existing.request, existing.record_missing = request, False
                return existing
            raise ApiError(409, f"sandbox {public_id} already exists", "conflict")
        spec, ttl = self.spec_of(request, tenant, public_id)
        if sum(self.live_counts().values()) >= self.max_sandboxes:
            raise ApiError(503, "the service is at capacity; retry later", "capacity", {"Retry-After": "5"})
        if self.live_counts().get(tenant.name, 0) >= tenant.max_sandboxes:
            raise ApiError(
                503,
                f"this key's quota of {tenant.max_sandboxes} live sandboxes is used; delete some or retry later",
                "quota_sandboxes",
                {"Retry-After": "5"},
            )
        wait = self.rate.admit(tenant)
        if wait:
            raise ApiError(
                503,
                f"this key's {tenant.creates_per_minute} creates per minute are used; retry later",
                "quota_rate",
                {"Retry-After": str(max(1, round(wait)))},
            )
        box = Box(public_id, tenant, request, ttl, self.idle_timeout)
        box.origin = origin
        if request.sandbox_id is None:
            self._unanswered[unanswered_key] = box
        self.boxes[(tenant.name, public_id)] = box
        self.deleted.pop((tenant.name, public_id), None)
        self.lost.pop((tenant.name, public_id), None)
        self.metrics.creates[tenant.name] += 1
        self.spawn(self._create(box, spec))
        return box

    def answered(self, box: Box) -> None:
        """The create's answer reached its caller: no retry of it can come any more."""
        box.origin = None
        self._forget_unanswered(box)

    def _forget_unanswered(self, box: Box) -> None:
        if box.request.sandbox_id is None:
            key = (box.tenant.name, msgspec.json.encode(box.request))
            if self._unanswered.get(key) is box:
                del self._unanswered[key]

    async def _create(self, box: Box, spec: oa.SandboxSpec) -> None:
        try:
            sandbox = await self.adapter.create(spec)
        except Exception as exc:  # noqa: BLE001 - any failure is the sandbox's status, for /wait to report
            box.status, box.status_message = "failed", f"{type(exc).__name__}: {exc}".splitlines()[0]
            self.metrics.errors["create_failed"] += 1
            log.warning("create failed key=%s sandbox=%s: %s", box.tenant.name, box.id, box.status_message)
        else:
            box.sandbox = sandbox
            if box.deleted:  # deleted while it was being made
                await self._destroy(box)
                return
            if self.service_name:
                await adopt.write_record(box)
            box.status = "ready"
        finally:
            box.ready.set()

    # -- delete ----------------------------------------------------------------------------

    def delete(self, tenant: Tenant, sandbox_id: str, why: str = "deleted") -> bool:
        """Remove a sandbox (its teardown runs in the background). False when it was not there."""
        key = (tenant.name, sandbox_id)
        box = self.boxes.pop(key, None)
        if box is None:
            if self.adopting and key not in self.deleted:
                raise ApiError(
                    503, "the service restarted and is re-adopting its sandboxes; retry", "restarting", RETRY
                )
            return key in self.deleted or key in self.lost
        box.deleted = True
        self._forget_unanswered(box)
        self.deleted[key] = time.monotonic()
        self.metrics.deletes[(tenant.name, why)] += 1
        if box.sandbox is not None:
            self.spawn(self._destroy(box))
        return True

    async def _destroy(self, box: Box) -> None:
        for stack, _ in list(box.sessions.values()):
            with contextlib.suppress(Exception):
                await stack.aclose()
        box.sessions.clear()
        await close_lane(box)
        try:
            await box.sandbox.close()
        except Exception as exc:  # noqa: BLE001 - logged and counted; the adapter's TTL still ends it
            self.metrics.errors["destroy_failed"] += 1
            log.warning("destroy failed key=%s sandbox=%s: %s", box.tenant.name, box.id, exc)

    # -- lifetime --------------------------------------------------------------------------

    def reap_once(self) -> list[str]:
        removed = []
        for (tenant_name, sandbox_id), box in list(self.boxes.items()):
            why = box.expired()
            if why:
                self.delete(box.tenant, sandbox_id, why)
                removed.append(f"{tenant_name}/{sandbox_id}")
        horizon = time.monotonic() - 3600  # tombstones answer retried DELETEs for an hour
        self.deleted = {key: at for key, at in self.deleted.items() if at > horizon}
        return removed

    async def reaper(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            for name in self.reap_once():
                log.info("reaped %s", name)

    def spawn(self, coro: Any) -> asyncio.Task:
        """A task the service owns, not a request: a client hanging up never cancels it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Remove every sandbox and wait for the teardowns."""
        for box in list(self.boxes.values()):
            self.delete(box.tenant, box.id, "shutdown")
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

"""Admission control in front of an adapter.

Backends fall over when asked for too much at once (a Docker daemon serialises creates,
an API server throttles). The pool bounds concurrent creates (``max_creating``: the
adapter's own bound where it declares one, docker's and kubernetes' option of that name, so
the setting has one owner) and live sandboxes, and
after a backend error it makes every create wait an exponentially growing pause, reset
by the next success. Each sandbox carries owner/run/expiry labels (added by the adapter)
and a self-destruct deadline inside it; ``reap`` removes what dead runs left.

The pool owns the create timeout (``create_timeout``): it runs ``adapter.create`` under a
cancel scope with that deadline. An adapter that can say why a create is slow (a pod
still unschedulable, an image still pulling) reads the deadline with
``orchard_async.kit.deadline`` and fails a little before it with its own ``CreateFailed``.

A pool can keep sandboxes warm (``warm(spec, count)``; ``orchard_async.engine.warm``): ``acquire``
then hands over a checked, pre-created sandbox when it has one. Warm sandboxes are created in
the pool's own task group (``orchard_async.kit.background``) under the same admission control;
``close()`` (or leaving ``async with pool``) closes them and stops that work.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from orchard_async.capabilities import facts_of
from orchard_async.engine.warm import DEFAULT_MAX_IDLE, WARM_STATS, WarmStock
from orchard_async.errors import BackendUnavailable, ConfigError, CreateFailed
from orchard_async.kit.background import Background, BackgroundOwner
from orchard_async.kit.retry import Backoff
from orchard_async.protocols import Adapter, Sandbox
from orchard_async.types import SandboxSpec

DEFAULT_MAX_CREATING = 32  # creates at once on an adapter that declares no bound of its own


class Pool(BackgroundOwner):
    """Sandboxes of one adapter under admission control (see the module docstring).
    ``async with pool.sandbox(spec) as sandbox`` for a sandbox that lives for a block;
    ``acquire`` and ``close_sandbox`` for one that does not (the episode loop's).
    ``max_live`` bounds the sandboxes handed out; warm ones waiting on a shelf are not
    counted (they are bounded by the warm counts). ``max_creating`` bounds the creates in
    flight; None (the default) reads it from the adapter (``max_creating_of``)."""

    def __init__(
        self,
        adapter: Adapter,
        *,
        max_live: int | None = None,
        max_creating: int | None = None,
        create_timeout: float = 120.0,
        max_backoff: float = 30.0,
        warm_max_idle: float = DEFAULT_MAX_IDLE,
    ):
        self.adapter = adapter
        self.max_creating = max_creating_of(adapter) if max_creating is None else max_creating
        if self.max_creating < 1:
            raise ConfigError(f"max_creating must be at least 1, got {self.max_creating}")
        self._live = anyio.Semaphore(max_live) if max_live else None  # not a limiter: any task may release
        # A semaphore, not a CapacityLimiter: no checkpoint on an uncontended acquire and no
        # per-borrower bookkeeping (the task that acquires is the one that releases).
        self._creating = anyio.Semaphore(self.max_creating, fast_acquire=True)
        self.create_timeout = create_timeout
        self.max_backoff = max_backoff
        self._failures = 0  # consecutive backend failures
        self._resume_at = 0.0  # monotonic time before which creates wait
        self.created = 0  # sandboxes handed out (warm or not)
        self.destroyed = 0
        self._background = Background()
        self._warm = WarmStock(self._create, self._background, max_idle=warm_max_idle)

    async def acquire(self, spec: SandboxSpec) -> Sandbox:
        if self._live:
            await self._live.acquire()
        try:
            sandbox = None
            if self._warm.shelves:  # a dict test: a pool that warms nothing pays nothing
                sandbox = await self._warm.take(spec)
                if sandbox is None:
                    with self._warm.demanding():  # creates for warm stock wait for this one
                        sandbox = await self._create(spec)
            if sandbox is None:
                sandbox = await self._create(spec)
        except BaseException:
            if self._live:
                self._live.release()
            raise
        self.created += 1
        return sandbox

    async def _create(self, spec: SandboxSpec) -> Sandbox:
        """``adapter.create`` under admission control: create concurrency, timeout, backoff."""
        async with self._creating:
            pause = self._resume_at - time.monotonic()
            if pause > 0:
                await anyio.sleep(pause)
            try:
                # A bare CancelScope: fail_after adds a generator context manager per create.
                with anyio.CancelScope(deadline=anyio.current_time() + self.create_timeout) as limit:
                    sandbox = await self.adapter.create(spec)
                if limit.cancelled_caught:
                    raise TimeoutError
            except TimeoutError:
                self._backend_failed()
                raise CreateFailed(f"create did not finish within {self.create_timeout:.0f}s") from None
            except (CreateFailed, BackendUnavailable):
                self._backend_failed()
                raise
        self._failures = 0
        return sandbox

    def _backend_failed(self) -> None:
        self._failures += 1
        pause = Backoff(0.05, cap=self.max_backoff, jitter=(0.5, 1.0)).delay(self._failures)
        self._resume_at = max(self._resume_at, time.monotonic() + pause)

    async def close_sandbox(self, sandbox: Sandbox) -> None:
        """Close a sandbox from ``acquire`` (shielded: it is closed even when the caller is
        being cancelled) and give back its place under ``max_live``. A sandbox is ended
        by closing it (protocols.py); this is that, plus the pool's bookkeeping."""
        try:
            with anyio.CancelScope(shield=True):
                await sandbox.close()
        finally:
            self.destroyed += 1
            if self._live:
                self._live.release()

    @asynccontextmanager
    async def sandbox(self, spec: SandboxSpec) -> AsyncIterator[Sandbox]:
        sandbox = await self.acquire(spec)
        try:
            yield sandbox
        finally:
            await self.close_sandbox(sandbox)

    async def reap(self, older_than: float = 0.0) -> list[str]:
        return await self.adapter.reap(older_than)

    # -- warm sandboxes (orchard_async.engine.warm) ---------------------------------------------------

    def warm(self, spec: SandboxSpec, count: int) -> None:
        """Keep ``count`` sandboxes of ``spec`` created ahead of need (0: stop replenishing).
        Acquires of ``spec`` with other per-episode labels (``orchard.episode``,
        ``orchard.attempt``) are served from the same ones."""
        self._warm.set_target(spec, count)

    async def trim_warm(self, specs: list[SandboxSpec] | None = None) -> None:
        """Stop warming ``specs`` (all when None) and close their idle warm sandboxes."""
        await self._warm.trim(specs)

    @property
    def warming(self) -> bool:
        """Whether any spec is being kept warm (a count above 0)."""
        return any(shelf.target for shelf in self._warm.shelves.values())

    @property
    def warm_stats(self) -> dict[str, int]:
        """hits, claimed (an acquire took over a warm create under way), misses, created,
        failed, expired (too old to hand out), dead (failed the check); and ``ready`` now."""
        ready = sum(len(shelf.ready) for shelf in self._warm.shelves.values())
        return {name: self._warm.stats[name] for name in WARM_STATS} | {"ready": ready}

    async def close(self) -> None:
        """Close the warm sandboxes and stop creating them (the handed-out ones are their
        holders' to close). The pool may be used again afterwards."""
        await self._warm.close()


def max_creating_of(adapter: Adapter) -> int:
    """The adapter's bound on creates in flight (its facts' ``max_creating``, where its backend
    needs one and its options set it), else ``DEFAULT_MAX_CREATING``."""
    declared = facts_of(adapter).max_creating
    return DEFAULT_MAX_CREATING if declared is None else declared

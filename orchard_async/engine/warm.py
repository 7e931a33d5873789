"""The pool's warm stock: sandboxes created ahead of need, so that an episode's acquire is a
hand-over.

A ``Pool`` keeps a shelf of warm sandboxes per spec it was asked to warm (``Pool.warm(spec,
count)``; the rollout engine sets the counts from its plan, see
``orchard_async.engine.plan.warm_ahead``). This module holds the stock, not the choice of what
to stock: it imports nothing else of the engine. Shelves are
keyed by the spec without its per-episode labels (``orchard.episode``, ``orchard.attempt``):
every episode of a task asks for a spec that differs only there. So a warm sandbox's backend
object (container, pod, lease file) carries the task's labels and the lease labels but not
the episode's; the episode's labels are put on the handed-out sandbox object
(``sandbox.labels``), where recipes read them.

What a shelf guarantees:

* replenished in the background (the pool's own task group, ``orchard_async.kit.background``):
  each sandbox taken starts its replacement; creates go through the pool's admission control
  (its create concurrency, timeout and backoff), like an episode's own;
* checked before it is handed out: its shell must answer a ping (``_healthy``: a round trip
  through the sandbox's own shell that runs no command; ``true`` where it has no shell); a
  sandbox that died while it waited is closed and the next one tried, never handed out;
* its TTL counts from its creation: a warm sandbox is created with the requested TTL plus
  ``max_idle``, and is handed out only while its age is at most ``max_idle`` (so its
  remaining TTL is at least what the episode asked for); older ones are closed and replaced;
* an acquire that finds the shelf empty but a create of its spec under way takes that create
  over rather than starting another (the first wave of a rollout waits for no more than a
  cold create); while any acquire waits for a create, no create for stock starts (a daemon
  that serialises creates would make the awaited one wait behind speculation);
* warm sandboxes are ordinary sandboxes with lease labels: closing the pool closes them,
  and after a crash ``reap`` removes them like any other.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio
import msgspec

from orchard_async.capabilities import Ping
from orchard_async.errors import BackendUnavailable, ConfigError, CreateFailed
from orchard_async.kit import labels as names
from orchard_async.kit.background import Background
from orchard_async.protocols import Sandbox
from orchard_async.types import SandboxSpec

log = logging.getLogger(__name__)

PER_EPISODE_LABELS = (names.EPISODE, names.ATTEMPT)  # what the episode loop adds to a task's spec
HEALTH_TIMEOUT = 5.0  # seconds a warm sandbox has to answer its check before it is handed out
DEFAULT_MAX_IDLE = 900.0  # seconds a warm sandbox may wait for an episode (and the TTL it gets on top)
WARM_STATS = ("hits", "claimed", "misses", "created", "failed", "expired", "dead")


def warm_key(spec: SandboxSpec) -> bytes:
    """The shelf a spec's sandboxes come from: its encoding without per-episode labels.
    (A SandboxSpec is frozen but not hashable: its labels and env are dicts.)"""
    shared = {k: v for k, v in spec.labels.items() if k not in PER_EPISODE_LABELS}
    return msgspec.json.encode(msgspec.structs.replace(spec, labels=shared), order="sorted")


@dataclass(eq=False, slots=True)
class _Warm:
    """One warm sandbox: being created (``sandbox`` None) or ready."""

    born: float  # monotonic time its create started: its TTL counts from here
    sandbox: Sandbox | None = None
    claimed: bool = False  # an acquire waits for this create to end
    scope: anyio.CancelScope | None = None  # its create's task: cancelled when the shelf is trimmed
    arrived: anyio.Event = field(default_factory=anyio.Event)  # set for a claimant when the create ends


@dataclass(eq=False)
class _Shelf:
    spec: SandboxSpec  # what its sandboxes are created with: no per-episode labels, TTL + max_idle
    target: int = 0
    ready: deque[_Warm] = field(default_factory=deque)
    making: list[_Warm] = field(default_factory=list)
    broken: str = ""  # why warming it stopped (the spec is at fault): episodes then see the error themselves

    @property
    def stock(self) -> int:
        return len(self.ready) + sum(1 for slot in self.making if not slot.claimed)


class WarmStock:
    """The shelves of one pool (see the module docstring). ``create`` is the pool's own
    create under admission control; ``background`` its task group."""

    def __init__(
        self,
        create: Callable[[SandboxSpec], Awaitable[Sandbox]],
        background: Background,
        *,
        max_idle: float = DEFAULT_MAX_IDLE,
    ):
        if not (max_idle > 0 and math.isfinite(max_idle)):
            raise ConfigError(f"warm max_idle must be a positive, finite number of seconds, got {max_idle!r}")
        self._create = create
        self._background = background
        self.max_idle = max_idle
        self.shelves: dict[bytes, _Shelf] = {}
        self.stats: Counter[str] = Counter()  # WARM_STATS (Pool.warm_stats says what each counts)
        self._keeper: anyio.CancelScope | None = None
        self._changed = anyio.Event()
        # Acquires waiting for a create (their own, or a warm one taken over). While there are
        # any, no create is started for stock: a backend that serialises creates (a Docker
        # daemon) would otherwise make the sandboxes someone waits for wait behind speculation.
        self.demand = 0

    # -- sizing ------------------------------------------------------------------------------

    def set_target(self, spec: SandboxSpec, count: int) -> None:
        """Keep ``count`` sandboxes of ``spec`` warm (0: stop replenishing; the ones there
        stay until taken, too old, or closed with ``trim``/``close``)."""
        if count < 0:
            raise ConfigError(f"a warm count must be 0 or more, got {count}")
        key = warm_key(spec)
        shelf = self.shelves.get(key)
        if shelf is None:
            if not count:
                return
            shared = {k: v for k, v in spec.labels.items() if k not in PER_EPISODE_LABELS}
            warm_spec = msgspec.structs.replace(spec, labels=shared, ttl=spec.ttl + self.max_idle)
            shelf = self.shelves[key] = _Shelf(warm_spec)
        shelf.target = 0 if shelf.broken else count
        self._refill(shelf)
        if self._keeper is None:
            self._keeper = self._background.start_soon(self._keep)

    def _refill(self, shelf: _Shelf) -> None:
        if self.demand:
            return  # resumed by ``demanding`` when the last waiting acquire has its sandbox
        for _ in range(shelf.target - shelf.stock):
            slot = _Warm(born=time.monotonic())
            shelf.making.append(slot)
            slot.scope = self._background.start_soon(self._make, shelf, slot)

    async def _make(self, shelf: _Shelf, slot: _Warm) -> None:
        sandbox = None
        try:
            sandbox = await self._create(shelf.spec)
        except (CreateFailed, BackendUnavailable) as exc:  # the pool's backoff paces the next try
            self.stats["failed"] += 1
            log.info("warm pool: a create failed: %s", exc)
        except Exception as exc:  # noqa: BLE001 - the episodes that ask for it see the error from their own create
            # The spec is at fault (ConfigError) or the adapter is: more creates would fail
            # the same way, without the backoff that paces backend failures.
            self.stats["failed"] += 1
            shelf.broken, shelf.target = f"{type(exc).__name__}: {exc}", 0
            # info, not warning: the same error reaches the user once, from the episode's own
            # create; a warning would print it again (Python's last-resort handler) per spec.
            log.info("warm pool: stopped warming a spec: %s", shelf.broken)
        finally:
            # No checkpoint from the create's return to here: the sandbox is placed, or closed.
            shelf.making.remove(slot)
            slot.sandbox = sandbox
            if sandbox is not None:
                self.stats["created"] += 1
                if slot.claimed:
                    pass  # its claimant takes it
                elif self._keeper is None:  # closing
                    self._discard(sandbox)
                else:
                    shelf.ready.append(slot)
                    self._changed.set()
            if slot.claimed:
                slot.arrived.set()
        if sandbox is None and self._keeper is not None and not shelf.broken:
            self._refill(shelf)  # after a failed create: the pool's backoff delays the next one

    # -- handing out -------------------------------------------------------------------------

    async def take(self, spec: SandboxSpec) -> Sandbox | None:
        """A warm sandbox of ``spec`` (checked, with the episode's labels on it), or None
        when there is none to be had: the caller creates one."""
        shelf = self.shelves.get(warm_key(spec))
        if shelf is None:
            return None
        while shelf.ready:
            slot = shelf.ready.popleft()
            sandbox = slot.sandbox
            try:
                if not self._fresh(slot):
                    self.stats["expired"] += 1
                    self._discard(sandbox)
                    continue
                try:
                    healthy = await _healthy(sandbox)  # type: ignore[arg-type]
                except BaseException:
                    self._discard(sandbox)  # cancelled during the check: not handed out, not leaked
                    raise
                if not healthy:
                    self.stats["dead"] += 1
                    self._discard(sandbox)
                    continue
            finally:
                # Its replacement starts after the check, not beside it: a create's own work on
                # the event loop (the local adapter's files and processes) would delay the check.
                self._refill(shelf)
            self.stats["hits"] += 1
            return _labelled(sandbox, spec)  # type: ignore[arg-type]
        slot = next((slot for slot in shelf.making if not slot.claimed), None)
        if slot is not None:
            slot.claimed = True
            try:
                with self.demanding():
                    self._refill(shelf)  # the stock it took over is made again once nobody waits
                    await slot.arrived.wait()
            except BaseException:
                slot.claimed = False
                if slot.sandbox is not None:  # it arrived as this acquire was cancelled
                    self._discard(slot.sandbox)
                raise
            if slot.sandbox is not None:
                self.stats["claimed"] += 1
                return _labelled(slot.sandbox, spec)
        self.stats["misses"] += 1
        return None

    @contextmanager
    def demanding(self) -> Iterator[None]:
        """Around an acquire's wait for a create: creates for stock wait until no acquire waits."""
        self.demand += 1
        try:
            yield
        finally:
            self.demand -= 1
            if not self.demand and self._keeper is not None:
                for shelf in self.shelves.values():
                    self._refill(shelf)

    def _fresh(self, slot: _Warm) -> bool:
        """Young enough that its remaining TTL covers what an episode asked for."""
        return time.monotonic() - slot.born <= self.max_idle

    def _discard(self, sandbox: Sandbox | None) -> None:
        if sandbox is not None:
            # Not cancelled by close: a close is bounded, shielded, and must finish.
            self._background.start_soon(sandbox.close, cancel_on_close=False)

    async def _keep(self) -> None:
        """Retire warm sandboxes as they reach ``max_idle`` (and start their replacements),
        so that a shelf stays usable through a pause in demand."""
        while True:
            due = math.inf
            for shelf in self.shelves.values():
                for slot in list(shelf.ready):
                    if self._fresh(slot):
                        due = min(due, slot.born + self.max_idle)
                    else:
                        shelf.ready.remove(slot)
                        self.stats["expired"] += 1
                        self._discard(slot.sandbox)
                        self._refill(shelf)
            with anyio.move_on_after(due - time.monotonic() + 0.001 if math.isfinite(due) else math.inf):
                await self._changed.wait()
            self._changed = anyio.Event()

    # -- closing -----------------------------------------------------------------------------

    async def trim(self, specs: Sequence[SandboxSpec] | None = None) -> None:
        """Stop warming ``specs`` (all when None): cancel their creates that no acquire waits
        for, and close their idle warm sandboxes (waiting until they are closed)."""
        keys = None if specs is None else {warm_key(spec) for spec in specs}
        idle: list[Sandbox] = []
        for key, shelf in self.shelves.items():
            if keys is None or key in keys:
                shelf.target = 0
                for slot in shelf.making:
                    if not slot.claimed and slot.scope is not None:
                        slot.scope.cancel()  # a create cancelled midway leaves nothing (the adapter's contract)
                idle += [slot.sandbox for slot in shelf.ready if slot.sandbox is not None]
                shelf.ready.clear()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as group:
                for sandbox in idle:
                    group.start_soon(sandbox.close)

    async def close(self) -> None:
        """Close every warm sandbox, cancel the creates under way (a create cancelled midway
        leaves nothing: the adapter's contract) and wait for all of it."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
        await self.trim()
        await self._background.close()


def _labelled(sandbox: Sandbox, spec: SandboxSpec) -> Sandbox:
    """The episode's own labels on the sandbox object (not on its backend object: see the
    module docstring)."""
    extra = {k: spec.labels[k] for k in PER_EPISODE_LABELS if k in spec.labels}
    if extra:
        sandbox.labels = {**sandbox.labels, **extra}
    return sandbox


async def _healthy(sandbox: Sandbox) -> bool:
    """A round trip through the sandbox itself: a sandbox whose shell answers has a live
    process on the far side of a working stream. A shell sandbox (local, docker,
    kubernetes) is pinged (``ShellSandbox.ping``: its shell answers a line itself, no
    fork, no output relays); any other runs ``true``."""
    try:
        if isinstance(sandbox, Ping):
            return bool(await sandbox.ping(HEALTH_TIMEOUT))
        result = await sandbox.exec("true", timeout=HEALTH_TIMEOUT)
    except Exception:  # noqa: BLE001 - any failure to answer means it is not handed out
        return False
    return result.ok

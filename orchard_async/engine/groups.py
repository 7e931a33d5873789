"""Rollout groups set up once: a task that opts in (``fork_after_setup = True``) is set up
in one base sandbox per group, which is snapshotted (``adapter.snapshot``) and closed; every
sample of the group then starts from the snapshot and skips ``setup``, reusing its
instruction. The snapshot is dropped when the group's last sample ends, or when the rollout
ends (cancelled or failed) with samples still to run.

Where a fork cannot be had the sample runs the plain path (its own create and setup): an
adapter without ``snapshot``, one that says it cannot snapshot here (``ConfigError``), or a
group whose base setup failed for a reason of the task's own (each sample then meets that
failure in its own setup, and records it). An ``InfraError`` while making the base
propagates: the engine retries the attempt like any other, and the next attempt of any
sample of the group tries the base again.

What the trajectories say: the sample whose attempt made the base carries the shared work
(the base's create and destroy in ``create``/``destroy``, ``task.setup`` and the snapshot in
``setup``, the base's commands in its ops), once for the group; every sample records
``forked_from`` (the snapshot id) and, when it waited for another sample's base,
``group_wait`` in its timings. So the time shares of a run count setup once per group.

Integrity: the snapshot is taken right after ``setup``, before any agent action, and the
base sandbox is closed before any sample runs: no sample can reach another or the
snapshot. Scoring never uses the snapshot (a ``GradedApart`` task grades in a fresh sandbox
of the plain spec).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from orchard_async.errors import ConfigError, InfraError
from orchard_async.kit import labels as names
from orchard_async.records.trajectory import Op

if TYPE_CHECKING:
    from orchard_async.engine.episode import Episode
    from orchard_async.engine.pool import Pool
    from orchard_async.types import SandboxSpec


def opts_in(task: Any) -> bool:
    """Whether a task asks to be set up once per group (an optional attribute)."""
    return bool(getattr(task, "fork_after_setup", False))


@dataclass(slots=True)
class Fork:
    """Where a sample starts: the group's snapshot and the instruction its setup returned."""

    snapshot: str
    instruction: str
    workdir: str  # the base's; a fork may have its own path (local: one dir per sandbox)

    def instruction_for(self, sandbox: Any) -> str:
        """The instruction as the fork's setup would have written it: naming its own work dir."""
        own = getattr(sandbox, "workdir", self.workdir)
        return self.instruction.replace(self.workdir, own) if self.workdir and own != self.workdir else self.instruction


@dataclass(slots=True)
class SharedSetup:
    """What making the base cost, for the sample whose attempt made it."""

    create: float = 0.0
    setup: float = 0.0  # task.setup, then the snapshot
    destroy: float = 0.0


@dataclass
class _Group:
    remaining: int
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    fork: Fork | None = None
    plain: bool = False  # the base setup failed for the task's own reason: samples set up alone


class GroupSetups:
    """The groups of one rollout whose tasks opt in (see the module docstring)."""

    def __init__(self, pool: Pool, episodes: Sequence[Episode]):
        self.pool = pool
        self.adapter = pool.adapter
        counts = Counter(episode.group_id for episode in episodes)
        # A group of one sample gains nothing from a base and a snapshot: it sets up alone.
        self._groups = {
            group_id: _Group(remaining=counts[group_id]) for group_id in forked_groups(self.adapter, episodes)
        }
        self.unsupported = ""  # why forks are not used in this rollout, once found

    @staticmethod
    def can_fork(adapter: Any) -> bool:
        return callable(getattr(adapter, "snapshot", None)) and callable(getattr(adapter, "drop_snapshot", None))

    async def start(
        self, episode: Episode, spec: SandboxSpec, ops: list[Op], t0: float, shared: SharedSetup
    ) -> Fork | None:
        """The fork this sample starts from (made now, by this sample's attempt, if it is
        the first to ask: ``shared`` then holds what that cost), or None for the plain path."""
        group = self._groups.get(episode.group_id)
        if group is None or group.plain or self.unsupported:
            return None
        if group.fork is not None:
            return group.fork
        async with group.lock:
            if group.fork is None and not group.plain and not self.unsupported:
                group.fork = await self._make_base(episode, spec, ops, t0, shared, group)
        return group.fork

    async def _make_base(
        self, episode: Episode, spec: SandboxSpec, ops: list[Op], t0: float, shared: SharedSetup, group: _Group
    ) -> Fork | None:
        from orchard_async.engine.episode import RecordingSandbox  # episode imports this module

        task = episode.task
        base_spec = msgspec.structs.replace(spec, labels={**spec.labels, names.ROLE: "group-setup"})
        mark = time.monotonic()
        raw = await self.pool.acquire(base_spec)  # an InfraError here is the attempt's: retried
        shared.create = time.monotonic() - mark
        ops.append(Op("create", mark - t0, shared.create, "group-setup"))
        try:
            mark = time.monotonic()
            try:
                # The agent's share of the deadline bounds the base's setup as it bounds a sample's.
                with anyio.fail_after(task.deadline - task.score_timeout):
                    instruction = await task.setup(RecordingSandbox(raw, ops, t0))
            except InfraError:
                raise
            except Exception:  # the task's own failure (or its setup overran): each sample meets it alone
                group.plain = True
                return None
            try:
                snapshot = await self.adapter.snapshot(raw)  # type: ignore[attr-defined]
            except ConfigError as exc:  # this adapter cannot snapshot here: plain path for the run
                self.unsupported = str(exc)
                return None
            ops.append(Op("snapshot", mark - t0, time.monotonic() - mark))
            shared.setup = time.monotonic() - mark
        finally:
            mark = time.monotonic()
            await self.pool.close_sandbox(raw)
            shared.destroy = time.monotonic() - mark
            ops.append(Op("destroy", mark - t0, shared.destroy, "group-setup"))
        return Fork(snapshot, instruction, raw.workdir)

    async def finish(self, episode: Episode) -> None:
        """One sample of a group has ended for good: drop the snapshot after the last."""
        group = self._groups.get(episode.group_id)
        if group is None:
            return
        group.remaining -= 1
        if group.remaining <= 0:
            await self._drop(group)

    async def _drop(self, group: _Group) -> None:
        fork, group.fork = group.fork, None
        if fork is not None:
            with anyio.CancelScope(shield=True):
                await self.adapter.drop_snapshot(fork.snapshot)  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        """Drop every snapshot still held (the rollout ended with samples still to run)."""
        for group in self._groups.values():
            await self._drop(group)


def forked_groups(adapter: Any, episodes: Sequence[Episode]) -> set[str]:
    """The groups that will start from a snapshot: two or more samples of a task that opts
    in, on an adapter that can snapshot."""
    if not GroupSetups.can_fork(adapter):
        return set()
    counts = Counter(episode.group_id for episode in episodes if opts_in(episode.task))
    return {group_id for group_id, count in counts.items() if count > 1}


def leaders_ahead(adapter: Any, episodes: Sequence[Episode], concurrency: int = 1) -> list[Episode]:
    """The plan in the order workers take it, each forked group's first sample moved ahead
    of earlier forked groups' other samples: with ``ahead`` = 1 + concurrency / group size
    (rounded up) groups, L0, L1, L2, F0..., L3, F1... for 8 workers on groups of 8. So a
    group's base is set up while the groups before it run, instead of every worker that took
    one of its samples waiting on one setup (measured in plan order: 0.71x the plain path's
    episodes/s with groups as large as the concurrency). At most ``ahead`` + 1 snapshots of
    a rollout exist at once."""
    forked = forked_groups(adapter, episodes)
    if not forked:
        return list(episodes)
    sizes = Counter(episode.group_id for episode in episodes if episode.group_id in forked)
    ahead = 1 + -(-concurrency // max(sizes.values()))
    order: list[Episode] = []
    held: deque[list[Episode]] = deque()  # forked groups whose first sample is out: their other samples
    seen: set[str] = set()
    for episode in episodes:
        if episode.group_id not in forked:
            order.append(episode)
        elif episode.group_id not in seen:
            seen.add(episode.group_id)
            order.append(episode)
            held.append([])
            if len(held) > ahead:
                order.extend(held.popleft())
        else:
            held[-1].append(episode)
    for samples in held:
        order.extend(samples)
    return order


@asynccontextmanager
async def group_setups(pool: Pool, episodes: Sequence[Episode]) -> AsyncIterator[GroupSetups | None]:
    """For a rollout: its groups' setups, or None when no group of two or more samples
    opts in or the adapter cannot snapshot at all (every sample then runs the plain path)."""
    groups = GroupSetups(pool, episodes)
    if not GroupSetups.can_fork(pool.adapter) or not groups._groups:
        yield None
        return
    try:
        yield groups
    finally:
        await groups.aclose()

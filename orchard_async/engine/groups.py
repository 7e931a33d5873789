"""Rollout groups set up once: a task that opts in (``fork_after_setup = True``) is set up
in one base sandbox per group, which is snapshotted (``adapter.snapshot``) and closed; every
sample of the group then starts from the snapshot and skips ``setup``, reusing its
instruction. The snapshot is dropped when the group's last sample ends, or when the rollout
ends (cancelled or failed) with samples still to run. Which groups fork, and in which order
their samples are taken, is the plan's decision (``plan.forked_groups``, ``plan.leaders_ahead``);
this module carries it out.

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
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from orchard_async.engine.phases import enter_phase
from orchard_async.engine.plan import Episode, base_spec, can_fork, forked_groups
from orchard_async.engine.pool import Pool
from orchard_async.engine.recording import RecordingSandbox
from orchard_async.errors import ConfigError, InfraError
from orchard_async.records.trajectory import Op
from orchard_async.types import SandboxSpec


@dataclass(slots=True)
class Fork:
    """Where a sample starts: the group's snapshot and the instruction its setup returned."""

    snapshot: str
    instruction: str
    workdir: str  # the base's; a fork may have its own path (local: one dir per sandbox)

    def instruction_for(self, sandbox: Any) -> str:
        """The instruction as the fork's setup would have written it: naming its own work dir."""
        own = sandbox.workdir
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

    def __init__(self, pool: Pool, episodes: Sequence[Episode], *, hold: bool = False):
        self.pool = pool
        # Growth may still come (engine.control, ``hold``): snapshots are kept until the rollout ends.
        self.hold = hold
        self.adapter = pool.adapter
        counts = Counter(episode.group_id for episode in episodes)
        # A group of one sample gains nothing from a base and a snapshot: it sets up alone.
        self._groups = {
            group_id: _Group(remaining=counts[group_id]) for group_id in forked_groups(self.adapter, episodes)
        }
        self.unsupported = ""  # why forks are not used in this rollout, once found

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
        task = episode.task
        mark = time.monotonic()
        raw = await self.pool.acquire(base_spec(spec))  # an InfraError here is the attempt's: retried
        shared.create = time.monotonic() - mark
        ops.append(Op("create", mark - t0, shared.create, "group-setup"))
        try:
            mark = time.monotonic()
            try:
                # The agent's share of the deadline bounds the base's setup as it bounds a sample's.
                with anyio.fail_after(task.deadline - task.score_timeout):
                    await enter_phase(task, "setup", raw, ops, t0)
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

    def grow(self, group_id: str, count: int) -> None:
        """A group gained ``count`` samples (engine.control): its snapshot waits for them too."""
        group = self._groups.get(group_id)
        if group is not None:
            group.remaining += count

    async def finish(self, episode: Episode) -> None:
        """One sample of a group has ended for good: drop the snapshot after the last."""
        group = self._groups.get(episode.group_id)
        if group is None:
            return
        group.remaining -= 1
        if group.remaining <= 0 and not self.hold:
            await self._drop(group)

    async def _drop(self, group: _Group) -> None:
        fork, group.fork = group.fork, None
        if fork is not None:
            with anyio.CancelScope(shield=True):
                await self.adapter.drop_snapshot(fork.snapshot)  # type: ignore[attr-defined]

    async def close(self) -> None:
        """Drop every snapshot still held (the rollout ended with samples still to run)."""
        for group in self._groups.values():
            await self._drop(group)


@asynccontextmanager
async def group_setups(
    pool: Pool, episodes: Sequence[Episode], *, hold: bool = False
) -> AsyncIterator[GroupSetups | None]:
    """For a rollout: its groups' setups, or None when no group of two or more samples
    opts in or the adapter cannot snapshot at all (every sample then runs the plain path).
    ``hold``: keep every snapshot until the rollout ends (its groups may grow)."""
    groups = GroupSetups(pool, episodes, hold=hold)
    if not can_fork(pool.adapter) or not groups._groups:
        yield None
        return
    try:
        yield groups
    finally:
        await groups.close()

"""The plan: what runs, in which order, and in sandboxes of which spec.

Everything the engine decides before it touches a sandbox is here, and only here:

* the episodes (``plan``): ``n`` episodes in GRPO groups of ``group_size`` samples, with ids
  that are a pure function of the plan (so ``--resume`` can skip finished ones);
* the sandbox specs an episode asks for: its agent's (``agent_spec``: the task's spec with a
  TTL sized from the task's deadline and the episode's own labels; ``forked_spec`` when it
  starts from its group's snapshot), a forked group's base (``base_spec``), a ``GradedApart``
  task's scorer (``scorer_spec``);
* which groups are set up once and forked (``forked_groups``; ``orchard_async.engine.groups``
  runs them) and the order the workers take the episodes in (``leaders_ahead``);
* what to keep warm while the plan is worked through (``warm_size``, ``WarmAhead``,
  ``warm_ahead``): the pool's warm stock (``orchard_async.engine.warm``) is told which
  specs to hold, and how many, from the episodes not yet started.
"""

from __future__ import annotations

import sys
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import anyio
import msgspec

from orchard_async.capabilities import Snapshots
from orchard_async.engine.warm import warm_key
from orchard_async.errors import ConfigError
from orchard_async.kit import labels as names
from orchard_async.protocols import GradedApart, Task
from orchard_async.types import SandboxSpec

if TYPE_CHECKING:
    from orchard_async.engine.pool import Pool

TTL_MARGIN = 120.0  # the sandbox lives this much past the episode deadline, so it outlives its verifier
# Adapters on which the rollout engine warms by default (``warm=None``): where a create waits
# on a daemon or a cluster. Not local: its create is work on this machine's own cores, which a
# warm pool moves off the episode's path but does not remove (no gain in episodes/s measured,
# docs/performance.md); not sim: its sandboxes draw their faults from their episode labels,
# which warm ones do not have on the backend object.
WARM_BY_DEFAULT = frozenset({"docker", "kubernetes", "remote"})


@dataclass(frozen=True, slots=True)
class Episode:
    """One planned episode: which task, which GRPO group, which sample in the group."""

    episode_id: str
    task: Task
    group_id: str
    sample: int


def plan(tasks: Sequence[Task], n: int, group_size: int = 1) -> list[Episode]:
    """``n`` episodes in groups of ``group_size`` samples of the same task, cycling tasks.

    Episode ids are a pure function of the plan, so ``--resume`` can skip finished ones.
    """
    if not tasks:
        raise ConfigError("no tasks to run")
    if n < 1 or group_size < 1:
        raise ConfigError(f"episodes ({n}) and group size ({group_size}) must be at least 1")
    if n % group_size:
        raise ConfigError(f"episodes ({n}) must be a multiple of the group size ({group_size})")
    episodes = []
    for group in range(n // group_size):
        task = tasks[group % len(tasks)]
        group_id = f"{task.id}/g{group}"
        for sample in range(group_size):
            episodes.append(Episode(f"{group_id}/s{sample}", task, group_id, sample))
    return episodes


def episode_count(tasks: Sequence[Task], n: int | None, group_size: int) -> int:
    """``n``, or one group per task when it is None (0 is a mistake, not "all")."""
    return len(tasks) * group_size if n is None else n


# -- the specs an episode asks for -----------------------------------------------------------


def agent_spec(episode: Episode, attempt: int, pause_allowance: float = 0.0, max_pause: float = 0.0) -> SandboxSpec:
    """The agent's sandbox for one attempt: the task's spec, living ``TTL_MARGIN`` past the
    task's deadline (for a rollout a trainer may pause, ``engine.control``: ``pause_allowance``
    more, and extendable by up to ``max_pause``), labelled with the episode and the attempt."""
    task = episode.task
    return msgspec.structs.replace(
        task.spec,
        ttl=task.deadline + TTL_MARGIN + pause_allowance,
        max_extension=max_pause or task.spec.max_extension,
        labels={
            **task.spec.labels,
            names.EPISODE: names.episode_label(episode.episode_id),
            names.ATTEMPT: str(attempt),
        },
    )


def forked_spec(spec: SandboxSpec, snapshot: str) -> SandboxSpec:
    """A sample of a forked group: the agent's spec, started from the group's snapshot."""
    return msgspec.structs.replace(spec, snapshot=snapshot)


def base_spec(spec: SandboxSpec) -> SandboxSpec:
    """A forked group's base (set up once, snapshotted, closed): the agent's spec in its own role."""
    return _in_role(spec, "group-setup")


def scorer_spec(spec: SandboxSpec, task: object = None) -> SandboxSpec:
    """A ``GradedApart`` task's fresh sandbox for grading: the agent's spec in its own role, or
    the task's own ``scorer_spec`` (a verifier with another image or network, as Harbor's
    separate verifier environment) with the agent's TTL and episode labels."""
    own = getattr(task, "scorer_spec", None)
    if isinstance(own, SandboxSpec):
        spec = msgspec.structs.replace(own, ttl=spec.ttl, labels={**spec.labels, **own.labels})
    return _in_role(spec, "scorer")


if sys.version_info >= (3, 12):

    def graded_apart(task: object) -> TypeGuard[GradedApart]:
        """``isinstance(task, GradedApart)``."""
        return isinstance(task, GradedApart)

else:

    def graded_apart(task: object) -> TypeGuard[GradedApart]:
        """``isinstance(task, GradedApart)``, the same answer without 3.11's cost: its check
        of a runtime Protocol lists the protocol's attributes again on every call (17 us,
        once or twice per episode). A class that is one (by its methods, or registered)
        or an instance whose two methods are there and not None, as 3.11's check has it."""
        if getattr(task, "submission", None) is not None and getattr(task, "grade", None) is not None:
            return True
        return issubclass(type(task), GradedApart) or issubclass(task.__class__, GradedApart)


def episode_specs(task: Task, *, forked: bool = False, leader: bool = False) -> list[SandboxSpec]:
    """The specs an episode of ``task`` asks for fresh sandboxes of, less its per-episode
    labels (the warm stock serves any episode from them): the agent's sandbox, and for a
    ``GradedApart`` task its scorer's. A sample of a forked group starts from its group's
    snapshot, which no warm pool can make ahead; its group's base (made by the ``leader``,
    the first sample the workers take) is a fresh sandbox of its own role."""
    spec = msgspec.structs.replace(task.spec, ttl=task.deadline + TTL_MARGIN)
    specs = [] if forked and not leader else [spec]
    if forked and leader:
        specs = [base_spec(spec)]
    if graded_apart(task):
        specs.append(scorer_spec(spec, task))
    return specs


def _in_role(spec: SandboxSpec, role: str) -> SandboxSpec:
    return msgspec.structs.replace(spec, labels={**spec.labels, names.ROLE: role})


# -- groups set up once and forked -----------------------------------------------------------


def opts_in(task: Any) -> bool:
    """Whether a task asks to be set up once per group (an optional attribute)."""
    return bool(getattr(task, "fork_after_setup", False))


def can_fork(adapter: Any) -> bool:
    """Whether the adapter can snapshot a sandbox and drop the snapshot (both optional)."""
    return isinstance(adapter, Snapshots)


def forked_groups(adapter: Any, episodes: Sequence[Episode]) -> set[str]:
    """The groups that will start from a snapshot: two or more samples of a task that opts
    in, on an adapter that can snapshot."""
    if not can_fork(adapter):
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


# -- what to keep warm -----------------------------------------------------------------------


def warm_size(adapter: Any, warm: int | None, concurrency: int, episodes: int) -> int:
    """How many episodes ahead the engine keeps warm: ``warm`` when given, else
    ``min(concurrency, episodes)`` on adapters in ``WARM_BY_DEFAULT`` and 0 elsewhere."""
    if warm is not None:
        if warm < 0:
            raise ConfigError(f"warm must be 0 or more sandboxes, got {warm}")
        return min(warm, episodes)
    name = adapter.name
    return min(concurrency, episodes) if name in WARM_BY_DEFAULT else 0


class WarmAhead:
    """The plan as a warm pool: while episodes are handed to workers, the pool keeps warm
    the fresh sandboxes of the next ``size`` episodes not yet started (see ``episode_specs``:
    a forked group's samples start from its snapshot instead)."""

    def __init__(self, pool: Pool, episodes: Sequence[Episode], size: int):
        self._pool = pool
        self._episodes = episodes
        self._size = size
        forked = forked_groups(pool.adapter, episodes)
        leaders: set[int] = set()  # the first sample of each forked group in the workers' order
        seen: set[str] = set()
        for index, episode in enumerate(episodes):
            if episode.group_id in forked and episode.group_id not in seen:
                seen.add(episode.group_id)
                leaders.add(index)
        self._kind = [(episode.group_id in forked, index in leaders) for index, episode in enumerate(episodes)]
        self._specs: dict[tuple[int, bool, bool], list[SandboxSpec]] = {}  # built once per task and kind
        self._window: Counter[bytes] = Counter()
        self._by_key: dict[bytes, SandboxSpec] = {}

    def _task_specs(self, index: int) -> list[SandboxSpec]:
        task = self._episodes[index].task
        forked, leader = self._kind[index]
        specs = self._specs.get((id(task), forked, leader))
        if specs is None:
            specs = self._specs[id(task), forked, leader] = episode_specs(task, forked=forked, leader=leader)
        return specs

    def _shift(self, index: int, change: int) -> None:
        for spec in self._task_specs(index):
            key = warm_key(spec)
            self._by_key[key] = spec
            self._window[key] += change
            self._pool.warm(spec, self._window[key])

    def __iter__(self) -> Iterator[Episode]:
        """The episodes in plan order; each one handed out moves the window on by one."""
        for index in range(min(self._size, len(self._episodes))):
            self._shift(index, +1)
        for index, episode in enumerate(self._episodes):
            self._shift(index, -1)
            if index + self._size < len(self._episodes):
                self._shift(index + self._size, +1)
            yield episode

    @property
    def specs(self) -> list[SandboxSpec]:
        return list(self._by_key.values())


@asynccontextmanager
async def warm_ahead(
    pool: Pool, episodes: Sequence[Episode], warm: int | None, concurrency: int
) -> AsyncIterator[Iterator[Episode]]:
    """The engine's iterator over its plan, keeping the next ``warm_size(...)`` episodes'
    sandboxes warm. At the end (or on cancellation) the plan's specs stop being warmed and
    their idle warm sandboxes are closed; and when the pool then warms nothing else, its
    background work ends too (a pool may be used again after ``close``)."""
    size = warm_size(pool.adapter, warm, concurrency, len(episodes))
    if not size:
        yield iter(episodes)
        return
    ahead = WarmAhead(pool, episodes, size)
    try:
        yield iter(ahead)
    finally:
        with anyio.CancelScope(shield=True):
            await pool.trim_warm(ahead.specs)
            if not pool.warming:
                await pool.close()

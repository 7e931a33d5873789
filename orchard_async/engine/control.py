"""What a trainer does to a rollout while it runs: abort episodes, grow groups, pause for a
weight sync. One ``RolloutControl`` per rollout, passed as ``rollout(..., control=control)``::

    control = RolloutControl(weight_version="0", hold=True)
    async with contextlib.aclosing(rollout(tasks, policy, adapter, group_size=4, control=control)) as stream:
        async for trajectory in stream:
            if too_stale(trajectory):
                control.abort(trajectory.episode_id)       # or control.abort_all()
            if no_signal_yet(trajectory.group_id):
                control.grow(trajectory.group_id, 4)       # 4 more samples of the same task
            if time_to_sync():
                await control.pause()                      # every episode at a turn boundary
                sync_weights()
                control.resume(weight_version="7")
            if enough():
                control.close()                            # no more growth: the stream ends when work drains

**Abort**: the episode's work is cancelled wherever it is (a command, a model call, setup,
scoring); its sandbox is closed in the engine's shielded ``finally`` blocks; its trajectory
ends ``aborted`` (``EndReason.ABORTED``, status failed, no steps, never retried): never data,
counted apart by the summary and left out by every export. An episode not yet started is
aborted without a sandbox.

**Grow** (progressive sampling): ``grow(group_id, k)`` adds ``k`` samples of the group's task,
numbered on from the group's last sample, run after the plan's episodes. A group set up once
and forked (``engine.groups``) keeps its snapshot while the control holds the rollout open,
so its new samples start from the same snapshot as its first ones. With ``hold=False`` the
rollout ends when its work drains, and growing a group after that is an error.

**Pause** at a turn boundary: ``pause()`` stops every episode before its next policy call
(a command or a model call under way finishes first) and returns when every running episode
has stopped; an episode in setup or scoring stops at its next boundary, one about to start
does not start. ``resume(weight_version)`` lets them go on. The paused time does not count
against an episode's deadline (its agent phase's deadline moves on by it), and its sandbox
lives through it. A sandbox that can (``capabilities.ExtendableTTL``: sim, local, docker,
kubernetes) has its TTL extended by the time paused: every ``EXTEND_EVERY`` seconds while
paused and once more at resume, each an ``Op("extend", ...)`` in the trajectory's ops, up to
``max_pause`` seconds per episode (its spec's ``max_extension``, the hard cap: kubernetes'
``activeDeadlineSeconds``). Beyond that, and on a sandbox that cannot be extended, the agent's
sandbox is made with ``pause_allowance`` seconds more TTL, and an episode paused longer than
what its extensions and that allowance cover ends ``aborted`` at resume rather than meet a
sandbox that expired under it. Every step is tagged with the weight version in force when its
policy call began (``Step.weight_version``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from orchard_async.capabilities import ExtendableTTL
from orchard_async.engine.plan import TTL_MARGIN, Episode
from orchard_async.engine.recording import RecordingSandbox
from orchard_async.errors import ConfigError, InfraError
from orchard_async.records.trajectory import Op

DEFAULT_PAUSE_ALLOWANCE = 600.0  # seconds of pausing a sandbox's TTL is sized for
DEFAULT_MAX_PAUSE = 3600.0  # seconds of pausing an extendable sandbox's TTL may be extended for
# A paused episode's sandbox is extended this often: well within the TTL_MARGIN it has to spare
# past the agent's deadline, so it never expires between two extensions.
EXTEND_EVERY = TTL_MARGIN / 4


@dataclass
class _Running:
    scope: anyio.CancelScope
    paused: bool = False  # waiting at a turn boundary
    pause_budget: float = 0.0  # seconds of pausing left before its sandbox's TTL is at risk


@dataclass
class _GroupPlan:
    task: object
    next_sample: int


@dataclass
class RolloutControl:
    """A trainer's handle on one rollout (see the module docstring). ``weight_version``: the
    version the episodes start under; ``hold``: keep the rollout open for ``grow`` until
    ``close`` (False: it ends when its work drains); ``pause_allowance``: seconds of pausing
    each agent sandbox's TTL is sized for; ``max_pause``: seconds of pausing an extendable
    sandbox's TTL may be extended for, per episode (its spec's ``max_extension``)."""

    weight_version: str = ""
    hold: bool = False
    pause_allowance: float = DEFAULT_PAUSE_ALLOWANCE
    max_pause: float = DEFAULT_MAX_PAUSE
    _running: dict[str, _Running] = field(default_factory=dict, repr=False)
    _aborted: set[str] = field(default_factory=set, repr=False)
    _grown: deque[Episode] = field(default_factory=deque, repr=False)
    _groups: dict[str, _GroupPlan] = field(default_factory=dict, repr=False)
    _waiting: set[str] = field(default_factory=set, repr=False)  # planned, not started
    _changed: anyio.Event = field(default_factory=anyio.Event, repr=False)
    _resumed: anyio.Event = field(default_factory=anyio.Event, repr=False)
    _paused: bool = False
    _closed: bool = False
    _ended: bool = False
    _attached: bool = False
    _on_grow: list[Callable[[str, int], None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.pause_allowance < 0:
            raise ConfigError(f"pause_allowance must be 0 or more seconds, got {self.pause_allowance}")
        if not (0 <= self.max_pause < math.inf):
            raise ConfigError(f"max_pause must be a finite number of seconds (0 or more), got {self.max_pause}")
        self._resumed.set()

    # -- the trainer's calls -------------------------------------------------------------------

    def abort(self, episode_id: str) -> bool:
        """Abort one episode (running or not yet started). False when the rollout has no such
        episode still to end."""
        running = self._running.get(episode_id)
        if running is not None:
            self._aborted.add(episode_id)
            running.scope.cancel()
            return True
        if episode_id in self._waiting:
            self._aborted.add(episode_id)
            return True
        return False

    def abort_all(self) -> int:
        """Abort every episode not yet ended; how many that was."""
        ids = list(self._running) + list(self._waiting)
        return sum(self.abort(episode_id) for episode_id in ids)

    def grow(self, group_id: str, count: int) -> list[str]:
        """Add ``count`` samples to a group of this rollout; their episode ids."""
        if count < 1:
            raise ConfigError(f"grow adds at least 1 sample, got {count}")
        if self._ended or self._closed:
            raise ConfigError(
                f"cannot grow group {group_id!r}: the rollout has ended or was closed"
                + ("" if self.hold else " (pass hold=True to keep it open for growth)")
            )
        group = self._groups.get(group_id)
        if group is None:
            raise ConfigError(f"no group {group_id!r} in this rollout")
        ids = []
        for _ in range(count):
            episode = Episode(f"{group_id}/s{group.next_sample}", group.task, group_id, group.next_sample)  # type: ignore[arg-type]
            group.next_sample += 1
            self._grown.append(episode)
            self._waiting.add(episode.episode_id)
            ids.append(episode.episode_id)
        for hook in self._on_grow:
            hook(group_id, count)
        self._wake()
        return ids

    async def pause(self) -> None:
        """Stop every episode at its next turn boundary; returns when every running episode has."""
        self._paused = True
        self._resumed = anyio.Event()
        while self._paused and any(not running.paused for running in self._running.values()):
            await self._wait_change()

    def resume(self, weight_version: str | None = None) -> None:
        """Let paused episodes go on, their next steps under ``weight_version`` (when given)."""
        if weight_version is not None:
            self.weight_version = weight_version
        self._paused = False
        self._resumed.set()

    def close(self) -> None:
        """No more growth: the rollout ends once its work drains."""
        self._closed = True
        self._wake()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def running(self) -> list[str]:
        """The episodes started and not yet ended."""
        return list(self._running)

    # -- the engine's side ---------------------------------------------------------------------

    def attach(self, episodes: list[Episode]) -> None:
        """The rollout's plan (once per control: a control is one rollout's)."""
        if self._attached:
            raise ConfigError("a RolloutControl belongs to one rollout; make a new one for the next")
        self._attached = True
        for episode in episodes:
            group = self._groups.setdefault(episode.group_id, _GroupPlan(episode.task, 0))
            group.next_sample = max(group.next_sample, episode.sample + 1)
            self._waiting.add(episode.episode_id)

    def on_grow(self, hook: Callable[[str, int], None]) -> None:
        """Call ``hook(group_id, count)`` when a group grows (the engine's groups count their samples)."""
        self._on_grow.append(hook)

    def is_aborted(self, episode_id: str) -> bool:
        return episode_id in self._aborted

    def started(self, episode_id: str, scope: anyio.CancelScope) -> None:
        self._waiting.discard(episode_id)
        self._running[episode_id] = _Running(scope, pause_budget=self.pause_allowance)
        if episode_id in self._aborted:
            scope.cancel()

    def ended(self, episode_id: str) -> None:
        self._waiting.discard(episode_id)
        self._running.pop(episode_id, None)
        self._wake()

    async def next_grown(self) -> Episode | None:
        """A grown episode to run, waiting for one while growth may still come (the episodes
        still running may make the trainer grow a group; with ``hold``, until ``close``);
        None when the rollout's work is done."""
        while True:
            if self._grown:
                return self._grown.popleft()
            if self._closed or (not self.hold and not self._running):
                return None
            await self._wait_change()

    async def until_resumed(self) -> None:
        """Where an episode about to start waits while the rollout is paused."""
        await self._resumed.wait()

    def end(self) -> None:
        self._ended = True

    async def turn_boundary(self, episode_id: str, sandbox: RecordingSandbox | None = None) -> tuple[float, bool]:
        """Where an episode waits while paused: (seconds it waited, whether its pause outran its
        sandbox's TTL: what extensions of ``sandbox``, the agent's, and the allowance cover)."""
        if not self._paused:
            return 0.0, False
        running = self._running.get(episode_id)
        if running is None:
            return 0.0, False
        mark = time.monotonic()
        running.paused = True
        self._wake()
        extension = (
            _Extension(sandbox, mark) if sandbox is not None and isinstance(sandbox.inner, ExtendableTTL) else None
        )
        try:
            if extension is None:
                await self._resumed.wait()
            else:
                async with anyio.create_task_group() as keeper:
                    keeper.start_soon(extension.keep)
                    await self._resumed.wait()
                    keeper.cancel_scope.cancel()
        finally:
            running.paused = False
        waited = time.monotonic() - mark
        covered = await extension.finish() if extension is not None else 0.0
        running.pause_budget -= waited - covered
        return waited, running.pause_budget < 0

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _wait_change(self) -> None:
        await self._changed.wait()


class _Extension:
    """A paused episode's sandbox, its TTL extended by the time paused (ExtendableTTL): every
    EXTEND_EVERY seconds while paused, and the rest at resume. An extension refused for good
    (its cap, a backend that cannot) ends the extending: the pause allowance covers the rest."""

    def __init__(self, sandbox: RecordingSandbox, mark: float):
        self.sandbox = sandbox
        self.mark = mark  # monotonic time the pause began
        self.covered = 0.0  # seconds of the pause extended so far
        self.refused = False

    async def keep(self) -> None:
        while not self.refused:
            await anyio.sleep(EXTEND_EVERY)
            await self._extend()

    async def finish(self) -> float:
        await self._extend()
        return self.covered

    async def _extend(self) -> None:
        seconds = time.monotonic() - self.mark - self.covered
        if self.refused or seconds <= 0:
            return
        sandbox, start = self.sandbox, time.monotonic()
        try:
            # Shielded: an extension the backend applied is one counted, even when the
            # resume cancels the keeper in the middle of it.
            with anyio.CancelScope(shield=True):
                await sandbox.inner.extend_ttl(seconds)  # type: ignore[attr-defined]
        except (ConfigError, InfraError) as exc:  # ConfigError: its cap, or a backend that cannot
            self.refused = self.refused or isinstance(exc, ConfigError)
            outcome = type(exc).__name__
        else:
            self.covered += seconds
            outcome = f"+{seconds:.3f}s"
        sandbox.ops.append(Op("extend", start - sandbox.t0, time.monotonic() - start, outcome))

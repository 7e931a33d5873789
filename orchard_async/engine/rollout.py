"""The rollout engine: many episodes at once, finished trajectories out as they come.

    async with contextlib.aclosing(rollout(tasks, policy, adapter, n=64, group_size=8)) as stream:
        async for trajectory in stream:
            ...

Structured concurrency throughout: one task group, ``concurrency`` workers pulling from
the plan, so cancelling the consumer (Ctrl-C) cancels every episode, and each episode's
sandbox is destroyed in a shielded ``finally``. Infrastructure failures are retried in a
fresh sandbox up to ``max_retries`` times, each retry recorded in the trajectory; the
policy's mistakes are not retried.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec

from orchard_async.engine.control import RolloutControl
from orchard_async.engine.episode import run_attempt
from orchard_async.engine.groups import GroupSetups, group_setups
from orchard_async.engine.plan import Episode, episode_count, leaders_ahead, plan, warm_ahead
from orchard_async.engine.pool import Pool
from orchard_async.errors import ConfigError, InfraError
from orchard_async.kit.retry import Backoff
from orchard_async.protocols import Adapter, Policy, Task
from orchard_async.records.paths import check_output_file
from orchard_async.records.trajectory import (
    FORMAT_VERSION,
    EndReason,
    Retry,
    Trajectory,
    TrajectoryWriter,
    check_trajectory_file,
    check_trajectory_path,
    finished_ids,
    read_run_header,
    read_trajectories,
    run_header_differences,
)

RETRY_BACKOFF = 0.2  # seconds before the first retry; doubles each time
# Workers spawned before the spawner yields to let them start their episodes. Spawning all
# first held a large rollout's first model request back until every worker existed (~20 ms
# at 1,024 on anyio 4.16); a yield after each spawn costs a loop iteration each. 8 and 32
# were the best of 1, 8, 32, 128 and never (`bench turnaround`, docs/performance.md).
SPAWN_BATCH = 32


async def run_with_retries(
    episode: Episode,
    policy: Policy,
    pool: Pool,
    *,
    run_id: str,
    max_retries: int,
    retry_backoff: float = RETRY_BACKOFF,
    groups: GroupSetups | None = None,
    control: RolloutControl | None = None,
) -> Trajectory:
    retries: list[Retry] = []
    for attempt in range(max_retries + 1):
        started = time.monotonic()
        try:
            trajectory = await run_attempt(
                episode, policy, pool, run_id=run_id, attempt=attempt, groups=groups, control=control
            )
        except InfraError as exc:
            retries.append(
                Retry(
                    attempt=attempt,
                    reason=EndReason.of_infra_error(exc),
                    error=str(exc),
                    duration=time.monotonic() - started,
                )
            )
            if attempt < max_retries:
                await anyio.sleep(Backoff(retry_backoff, jitter=(0.5, 1.0)).delay(attempt))
            continue
        trajectory.retries = retries
        return trajectory
    last = retries[-1]
    return _ended_early(
        episode, policy, pool, run_id, last.reason, f"gave up after {len(retries)} attempts: {last.error}", retries
    )


def _ended_early(
    episode: Episode,
    policy: Policy,
    pool: Pool,
    run_id: str,
    reason: EndReason,
    error: str,
    retries: list[Retry],
    started_at: float | None = None,
) -> Trajectory:
    """The record of an episode that ended without a trajectory of its own (retries spent, or aborted)."""
    return Trajectory(
        episode_id=episode.episode_id,
        task_id=episode.task.id,
        group_id=episode.group_id,
        sample=episode.sample,
        policy=policy.name,
        adapter=pool.adapter.name,
        run_id=run_id,
        status="failed",
        end_reason=reason,
        error=error,
        retries=retries,
        started_at=time.time() if started_at is None else started_at,
    )


async def run_controlled(
    episode: Episode,
    policy: Policy,
    pool: Pool,
    *,
    run_id: str,
    max_retries: int,
    retry_backoff: float = RETRY_BACKOFF,
    groups: GroupSetups | None = None,
    control: RolloutControl | None = None,
) -> Trajectory:
    """``run_with_retries`` under a trainer's control (the same arguments; ``control`` is
    required): it starts only when the rollout is not paused, and an abort cancels it
    wherever it is (its sandboxes are closed on the way out, shielded) and records it as
    ``aborted``, whatever it had done."""
    if control is None:
        raise TypeError("run_controlled needs a control (run_with_retries runs an episode without one)")
    await control.until_resumed()
    started_at = time.time()
    trajectory = None
    if not control.is_aborted(episode.episode_id):
        with anyio.CancelScope() as scope:
            control.started(episode.episode_id, scope)
            try:
                trajectory = await run_with_retries(
                    episode,
                    policy,
                    pool,
                    run_id=run_id,
                    max_retries=max_retries,
                    retry_backoff=retry_backoff,
                    groups=groups,
                    control=control,
                )
            finally:
                control.ended(episode.episode_id)
    if trajectory is None or control.is_aborted(episode.episode_id):
        retries = trajectory.retries if trajectory is not None else []
        return _ended_early(
            episode, policy, pool, run_id, EndReason.ABORTED, "aborted by the trainer", retries, started_at
        )
    return trajectory


async def rollout(
    tasks: Sequence[Task],
    policy: Policy,
    adapter: Adapter | Pool,
    *,
    n: int | None = None,
    group_size: int = 1,
    concurrency: int = 8,
    max_retries: int = 2,
    retry_backoff: float = RETRY_BACKOFF,
    skip: Iterable[str] = (),
    run_id: str | None = None,
    warm: int | None = None,
    control: RolloutControl | None = None,
) -> AsyncIterator[Trajectory]:
    """Yield each episode's trajectory as soon as it ends (finished or failed, never lost).
    ``warm``: sandboxes kept created ahead for the next episodes of the plan (None: the
    concurrency on adapters where that pays, see ``orchard_async.engine.plan.warm_size``; 0: none).
    ``control``: a trainer's handle to abort episodes, grow groups and pause the rollout
    while it runs (``orchard_async.engine.control``)."""
    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
    if max_retries < 0:
        raise ConfigError(f"max_retries must be 0 or more, got {max_retries}")
    pool = adapter if isinstance(adapter, Pool) else Pool(adapter)
    skip = set(skip)
    episodes = [ep for ep in plan(tasks, episode_count(tasks, n, group_size), group_size) if ep.episode_id not in skip]
    run_id = run_id or uuid.uuid4().hex[:12]
    if not episodes:
        return
    if control is not None:
        control.attach(episodes)
    send, receive = anyio.create_memory_object_stream[Trajectory](max_buffer_size=concurrency)
    ordered = leaders_ahead(pool.adapter, episodes, concurrency)  # forked groups' bases set up early

    # one signature, chosen once: no extra frame on the uncontrolled path's every resume
    run_episode = run_with_retries if control is None else run_controlled

    async def worker(groups: GroupSetups | None) -> None:
        while True:
            episode = next(pending, None)  # shared iterator: each episode goes to exactly one worker
            if episode is None and control is not None:
                episode = await control.next_grown()  # a group the trainer grew
            if episode is None:
                return
            trajectory = await run_episode(
                episode,
                policy,
                pool,
                run_id=run_id,
                max_retries=max_retries,
                retry_backoff=retry_backoff,
                groups=groups,
                control=control,
            )
            if groups is not None:
                await groups.finish(episode)
            await send.send(trajectory)  # its checkpoint: a cancelled run stops here, before a closed stream

    async def workers() -> None:
        # Groups of tasks that opt in are set up once and forked (groups.py); their
        # snapshots are dropped as groups end, and here for any left when the run ends.
        hold = control is not None and control.hold
        async with send, group_setups(pool, episodes, hold=hold) as groups:
            if control is not None and groups is not None:
                control.on_grow(groups.grow)
            # Under a control, every worker is started: grown groups may add work beyond the plan.
            workers_wanted = concurrency if control is not None else min(concurrency, len(episodes))
            try:
                async with anyio.create_task_group() as group:
                    for spawned in range(1, workers_wanted + 1):
                        group.start_soon(worker, groups)
                        if spawned % SPAWN_BATCH == 0:
                            await anyio.lowlevel.checkpoint()
            finally:
                if control is not None:
                    control.end()

    async with warm_ahead(pool, ordered, warm, concurrency) as pending, anyio.create_task_group() as group:
        group.start_soon(workers)
        async with receive:
            try:
                async for trajectory in receive:
                    yield trajectory
            except GeneratorExit:
                # The consumer stopped early (aclose, break, Ctrl-C): cancel the episodes
                # (their sandboxes are destroyed in shielded finally blocks) and end quietly,
                # instead of letting the task group wrap GeneratorExit in an exception group.
                group.cancel_scope.cancel()


class RunSummary(msgspec.Struct, kw_only=True):
    written: int
    skipped: int
    path: str


def make_run_header(
    tasks: Sequence[Task],
    policy: Policy,
    adapter: Adapter | Pool,
    *,
    n: int | None = None,
    group_size: int = 1,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What makes a run this run: written as the first record of its trajectory file, and
    compared on ``resume``. ``extra`` adds what only the caller knows (the CLI adds the
    recipe, the task source and the adapter options that change results)."""
    inner = adapter.adapter if isinstance(adapter, Pool) else adapter
    return {
        "format": FORMAT_VERSION,
        "created_at": round(time.time(), 3),
        "task_ids": [task.id for task in tasks],
        "policy": policy.name,
        "adapter": inner.name,
        "episodes": episode_count(tasks, n, group_size),
        "group_size": group_size,
        **(extra or {}),
    }


def check_resume(out: Path, header: dict[str, Any], planned: Iterable[str]) -> set[str]:
    """The episode ids already in ``out``, after checking that the file is this run: its
    header matches ``header`` (``episodes`` may grow). A file written before run headers
    existed is checked on what its records say: every episode is in this run's plan, and
    was played by this policy on this adapter. Raises ConfigError naming what differs."""
    check_trajectory_file(out)
    recorded = read_run_header(out)
    if recorded is not None:
        differences = run_header_differences(recorded, header, allow_more_episodes=True)
        if differences:
            raise ConfigError(f"cannot resume {out}: it is a different run ({'; '.join(differences)})")
        return finished_ids(out)
    planned = set(planned)
    done: set[str] = set()
    for trajectory in read_trajectories(out):
        if trajectory.episode_id not in planned:
            raise ConfigError(
                f"cannot resume {out}: it holds episode {trajectory.episode_id!r}, which this run would not play "
                "(a different task set, episode count or group size)"
            )
        for field in ("policy", "adapter"):
            if getattr(trajectory, field) != header[field]:
                raise ConfigError(
                    f"cannot resume {out}: it is a different run ({field}: {getattr(trajectory, field)} in the file, "
                    f"{header[field]} now)"
                )
        done.add(trajectory.episode_id)
    return done


async def collect(
    tasks: Sequence[Task],
    policy: Policy,
    adapter: Adapter | Pool,
    out: str | Path,
    *,
    n: int | None = None,
    group_size: int = 1,
    resume: bool = False,
    replace: bool = False,
    run_header: dict[str, Any] | None = None,
    on_trajectory: Callable[[Trajectory], object] | None = None,
    **options: Any,
) -> RunSummary:
    """Run a rollout into a trajectory file whose first record is the run header.

    Everything is checked before the first sandbox is created: the file name and that it
    can be written, the plan, and for an existing file what to do with it. With ``resume``,
    the file must be the same run (its header matches; see ``check_resume``) and episodes
    already in it are skipped; with ``replace``, the file is replaced when the first
    episode ends; with neither, an existing file is an error rather than silently mixed.
    ``run_header`` adds caller-known settings to the header (see ``make_run_header``)."""
    out = check_output_file(check_trajectory_path(out))
    planned = plan(tasks, episode_count(tasks, n, group_size), group_size)
    header = make_run_header(tasks, policy, adapter, n=n, group_size=group_size, extra=run_header)
    exists = out.exists() and out.stat().st_size > 0
    if exists and not resume and not replace:
        raise ConfigError(
            f"{out} already has trajectories; pass resume=True (--resume) to continue it, or pick a new file"
        )
    done = check_resume(out, header, (e.episode_id for e in planned)) if exists and resume else set()
    # One run id for the whole file, across resumes: exports key groups by it.
    recorded = read_run_header(out) if exists and resume else None
    run_id = (recorded or {}).get("run_id") or options.pop("run_id", None) or uuid.uuid4().hex[:12]
    options.pop("run_id", None)
    header["run_id"] = run_id
    # Checked now (a MessagePack tail that is not ours is refused); the file is created or
    # changed only when the first episode ends, so a run that fails before that leaves none.
    writer = TrajectoryWriter(out, run_header=header, replace=replace and not resume)
    stream = rollout(tasks, policy, adapter, n=n, group_size=group_size, skip=done, run_id=run_id, **options)
    try:
        async for trajectory in stream:
            writer.write(trajectory)
            if on_trajectory is not None:
                on_trajectory(trajectory)
    finally:
        await stream.aclose()
        writer.close()
    return RunSummary(written=writer.written, skipped=len(done), path=str(out))

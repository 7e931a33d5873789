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

import random
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path

import anyio
import msgspec

from .episode import Episode, run_attempt
from .errors import ConfigError, CreateFailed, InfraError, ModelUnavailable, SandboxLost, VerifierError
from .pool import Pool
from .protocols import Adapter
from .task import Policy, Task
from .trajectory import Retry, Trajectory, TrajectoryWriter, finished_ids

RETRY_BACKOFF = 0.2  # seconds before the first retry; doubles each time


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


def _infra_reason(exc: InfraError) -> str:
    if isinstance(exc, VerifierError):
        return "verifier_error"
    if isinstance(exc, ModelUnavailable):
        return "model_unavailable"
    if isinstance(exc, SandboxLost):
        return "sandbox_lost"
    if isinstance(exc, CreateFailed):
        return "create_failed"
    return "infra_error"


async def run_with_retries(
    episode: Episode, policy: Policy, pool: Pool, *, run_id: str, max_retries: int, retry_backoff: float = RETRY_BACKOFF
) -> Trajectory:
    retries: list[Retry] = []
    for attempt in range(max_retries + 1):
        started = time.monotonic()
        try:
            trajectory = await run_attempt(episode, policy, pool, run_id=run_id, attempt=attempt)
        except InfraError as exc:
            retries.append(
                Retry(attempt=attempt, reason=_infra_reason(exc), error=str(exc), duration=time.monotonic() - started)
            )
            if attempt < max_retries:
                await anyio.sleep(retry_backoff * 2**attempt * random.uniform(0.5, 1.0))
            continue
        trajectory.retries = retries
        return trajectory
    last = retries[-1]
    return Trajectory(
        episode_id=episode.episode_id,
        task_id=episode.task.id,
        group_id=episode.group_id,
        sample=episode.sample,
        policy=policy.name,
        adapter=getattr(pool.adapter, "name", "?"),
        run_id=run_id,
        status="failed",
        end_reason=last.reason,
        error=f"gave up after {len(retries)} attempts: {last.error}",
        retries=retries,
        started_at=time.time(),
    )


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
) -> AsyncIterator[Trajectory]:
    """Yield each episode's trajectory as soon as it ends (finished or failed, never lost)."""
    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
    if max_retries < 0:
        raise ConfigError(f"max_retries must be 0 or more, got {max_retries}")
    pool = adapter if isinstance(adapter, Pool) else Pool(adapter)
    skip = set(skip)
    episodes = [ep for ep in plan(tasks, n or len(tasks) * group_size, group_size) if ep.episode_id not in skip]
    run_id = run_id or uuid.uuid4().hex[:12]
    if not episodes:
        return
    send, receive = anyio.create_memory_object_stream[Trajectory](max_buffer_size=concurrency)
    pending = iter(episodes)

    async def worker() -> None:
        for episode in pending:  # shared iterator: each episode goes to exactly one worker
            trajectory = await run_with_retries(
                episode, policy, pool, run_id=run_id, max_retries=max_retries, retry_backoff=retry_backoff
            )
            await send.send(trajectory)

    async def workers() -> None:
        async with send:
            async with anyio.create_task_group() as group:
                for _ in range(min(concurrency, len(episodes))):
                    group.start_soon(worker)

    async with anyio.create_task_group() as group:
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


async def collect(
    tasks: Sequence[Task],
    policy: Policy,
    adapter: Adapter | Pool,
    out: str | Path,
    *,
    resume: bool = False,
    on_trajectory: object = None,
    **options: object,
) -> RunSummary:
    """Run a rollout into a trajectory file. With ``resume``, episodes already in the file
    are skipped; without it, an existing file is an error rather than silently mixed."""
    out = Path(out)
    if out.exists() and out.stat().st_size and not resume:
        raise ConfigError(
            f"{out} already has trajectories; pass resume=True (--resume) to continue it, or pick a new file"
        )
    done = finished_ids(out) if resume else set()
    writer: TrajectoryWriter | None = None  # opened on the first result, so bad input creates no file
    stream = rollout(tasks, policy, adapter, skip=done, **options)  # type: ignore[arg-type]
    try:
        async for trajectory in stream:
            writer = writer or TrajectoryWriter(out)
            writer.write(trajectory)
            if callable(on_trajectory):
                on_trajectory(trajectory)
    finally:
        await stream.aclose()
        if writer:
            writer.close()
    return RunSummary(written=writer.written if writer else 0, skipped=len(done), path=str(out))

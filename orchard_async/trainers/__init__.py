"""Trainer adapters: orchard-async episodes in the shapes RL trainers take (docs/trainers.md).

* ``trl_rollout``: TRL's ``GRPOTrainer`` ``rollout_func`` (each prompt one episode, its
  ``num_generations`` repeats one group) and an ``environment_factory`` class;
* ``verl_loop``: a verl agent loop (registered as ``orchard_async``) returning verl's own
  ``AgentLoopOutput``, sampling through verl's server manager;
* ``skyrl_env``: a skyrl-gym ``BaseTextEnv`` (``init``/``step``/``close``), registered with
  skyrl-gym's ``register`` so ``skyrl_gym.make`` builds it.

Each needs its trainer's package (an optional extra; this package imports none of them).
What they share is here: ``training_sample`` (a trajectory of a token policy -> prompt ids,
response ids, mask, sampler logprobs, and whether it may be trained on), ``EpisodeRunner``
(episodes run from a trainer's synchronous code, on an event loop of their own) and
``BridgedEpisode`` (an episode whose actions come one at a time from outside: a trainer
that drives the model itself and calls ``step``).

The rule every adapter keeps: only an episode the scorer judged is data. An infrastructure
outcome (``create_failed``, ``sandbox_lost``, ``verifier_error``, ``model_unavailable``,
``infra_error``, ``aborted``) and the episode's own failure (``policy_error``,
``task_error``) are never a reward: each adapter turns them into its trainer's way of
dropping or masking a sample (``TrainingSample.trainable`` is False, ``reward`` None).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import anyio.from_thread

from orchard_async.engine.control import RolloutControl
from orchard_async.engine.plan import plan
from orchard_async.engine.pool import Pool
from orchard_async.engine.rollout import rollout
from orchard_async.errors import ConfigError
from orchard_async.protocols import Adapter, Policy, Task
from orchard_async.records.export import is_scored, token_records, unscored_reason
from orchard_async.records.trajectory import Action, Trajectory
from orchard_async.task import Observation


@dataclass
class TrainingSample:
    """One episode as a trainer's sample: one token sequence (``prompt_ids`` then
    ``response_ids``: the sampled tokens with mask 1 and the environment's with mask 0),
    the sampler's logprobs (0.0 under mask 0), and whether it may be trained on. An
    untrainable sample keeps a placeholder response of one masked token (trainers need
    one) and ``reward`` None; ``dropped`` says why (an end reason, or ``segments`` for an
    episode whose conversation was rewritten mid-way: several sequences, which one sample
    cannot hold)."""

    episode_id: str
    group_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward: float | None
    end_reason: str
    turns: int = 0
    weight_versions: list[str] = field(default_factory=list)
    dropped: str = ""

    @property
    def trainable(self) -> bool:
        return not self.dropped


def training_sample(trajectory: Trajectory, placeholder: Sequence[int]) -> TrainingSample:
    """``trajectory`` (of a token policy) as one sample; ``placeholder``: the prompt ids an
    untrainable sample carries (it has none of its own when it never sampled), whose last
    id is also its one masked response token."""
    if not placeholder:
        raise ConfigError("a placeholder prompt needs at least one token id")
    dropped = "" if is_scored(trajectory) else unscored_reason(trajectory)
    records = token_records([trajectory]) if not dropped else []
    if not dropped and len(records) != 1:
        dropped = "no_tokens" if not records else "segments"
    sample = TrainingSample(
        episode_id=trajectory.episode_id,
        group_id=trajectory.group_id,
        prompt_ids=list(placeholder),
        response_ids=[placeholder[-1]],
        response_mask=[0],
        response_logprobs=[0.0],
        reward=None,
        end_reason=str(trajectory.end_reason),
        turns=len(trajectory.steps),
        dropped=dropped,
    )
    if not dropped:
        record = records[0]
        sample.prompt_ids = list(record["prompt_ids"])
        sample.response_ids = list(record["response_ids"])
        sample.response_mask = list(record["response_mask"])
        sample.response_logprobs = list(record["response_logprobs"])
        sample.reward = float(trajectory.reward)
        sample.weight_versions = list(record["weight_versions"])
    return sample


class EpisodeRunner:
    """Orchard-async episodes run from a trainer's synchronous code: an event loop in a
    thread of its own (an anyio blocking portal), kept across calls so the adapter's
    sandboxes and warm state live between batches. ``close()`` ends it.

    ``run(tasks, policy, group_size=G)`` plays ``len(tasks) * G`` episodes, G samples of
    each task in a group, and returns their trajectories in plan order. ``abort_all()`` (from
    any thread) aborts the episodes of the batch under way (``engine.control``)."""

    def __init__(self, adapter: Adapter, *, concurrency: int = 8, max_retries: int = 1, **rollout_options: Any):
        self.adapter = adapter
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.rollout_options = rollout_options
        self._portal_context = anyio.from_thread.start_blocking_portal()
        self.portal = self._portal_context.__enter__()
        self.pool = Pool(adapter)
        self.control: RolloutControl | None = None

    def run(self, tasks: Sequence[Task], policy: Policy, *, group_size: int = 1) -> list[Trajectory]:
        return self.portal.call(self._run, list(tasks), policy, group_size)

    async def _run(self, tasks: list[Task], policy: Policy, group_size: int) -> list[Trajectory]:
        episodes = plan(tasks, len(tasks) * group_size, group_size)
        order = {episode.episode_id: index for index, episode in enumerate(episodes)}
        self.control = control = RolloutControl()
        found: list[Trajectory | None] = [None] * len(episodes)
        stream = _generator(
            rollout(
                tasks,
                policy,
                self.pool,
                n=len(episodes),
                group_size=group_size,
                concurrency=self.concurrency,
                max_retries=self.max_retries,
                control=control,
                **self.rollout_options,
            )
        )
        async with contextlib.aclosing(stream):
            async for trajectory in stream:
                found[order[trajectory.episode_id]] = trajectory
        missing = [episodes[i].episode_id for i, t in enumerate(found) if t is None]
        if missing:
            raise RuntimeError(f"the rollout ended without {len(missing)} episodes: {missing[:3]}")
        return [t for t in found if t is not None]

    def abort_all(self) -> int:
        control = self.control
        return self.portal.call(control.abort_all) if control is not None else 0

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # already closed
            self.portal.call(self.pool.close)
        self._portal_context.__exit__(None, None, None)

    def __enter__(self) -> EpisodeRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def group_runs(prompts: Sequence[Any], group_size: int) -> bool:
    """Whether ``prompts`` come as runs of ``group_size`` equal prompts (a GRPO batch)."""
    return (
        group_size > 0
        and len(prompts) % group_size == 0
        and all(
            prompts[start + k] == prompts[start]
            for start in range(0, len(prompts), group_size)
            for k in range(group_size)
        )
    )


# -- episodes driven one action at a time from outside -----------------------------------------


class _Bridge:
    """A policy whose actions come from outside: ``act`` hands the observation out and waits."""

    name = "bridge"

    def __init__(self) -> None:
        self.observations_in, self.observations = anyio.create_memory_object_stream[Observation](1)
        self.actions, self.actions_out = anyio.create_memory_object_stream[Action](1)

    async def act(self, observation: Observation) -> Action:
        await self.observations_in.send(observation)
        return await self.actions_out.receive()


@dataclass
class Turn:
    """What an outside driver sees after an action: the observation text, or the end."""

    observation: str = ""
    done: bool = False
    trajectory: Trajectory | None = None

    @property
    def reward(self) -> float | None:
        """The reward when the episode ended judged; None (never a reward) otherwise."""
        if self.trajectory is None or not is_scored(self.trajectory):
            return None
        return float(self.trajectory.reward)

    @property
    def end_reason(self) -> str:
        return str(self.trajectory.end_reason) if self.trajectory is not None else ""


class BridgedEpisode:
    """One episode of ``task`` whose actions a driver gives one at a time (``step``), run on
    ``runner``'s event loop through the whole engine (deadlines, the sandbox's lifetime,
    scoring). Not retried: the driver's model cannot replay its turns in a fresh sandbox,
    so an infrastructure failure ends it (as that failure: never a reward)."""

    def __init__(self, runner: EpisodeRunner, task: Task, *, episode_id: str = "bridged") -> None:
        self.runner = runner
        self.task = task
        self.episode_id = episode_id
        self.bridge = _Bridge()
        self.trajectory: Trajectory | None = None
        self.control = RolloutControl()
        self._done = anyio.Event()
        self.instruction = ""

    def start(self) -> Turn:
        """Create the sandbox and set the task up; the instruction, or the end when that failed."""
        self.runner.portal.start_task_soon(self._play)
        return self.runner.portal.call(self._next)

    async def _play(self) -> None:
        try:
            stream = _generator(
                rollout(
                    [self.task],
                    self.bridge,
                    self.runner.pool,
                    n=1,
                    max_retries=0,
                    control=self.control,
                    run_id=self.episode_id,
                )
            )
            async with contextlib.aclosing(stream):
                async for trajectory in stream:
                    self.trajectory = trajectory
        finally:
            self._done.set()

    async def _next(self) -> Turn:
        """The next observation, or the end of the episode (whichever comes first)."""
        observation: list[Observation] = []
        async with anyio.create_task_group() as group:

            async def take() -> None:
                with contextlib.suppress(anyio.EndOfStream):
                    observation.append(await self.bridge.observations.receive())
                group.cancel_scope.cancel()

            async def end() -> None:
                await self._done.wait()
                group.cancel_scope.cancel()

            group.start_soon(take)
            group.start_soon(end)
        if observation:
            seen = observation[0]
            if seen.step == 0:
                self.instruction = seen.instruction
                return Turn(observation=seen.instruction)
            last = seen.history[-1]
            return Turn(observation=last.observation or f"error: {last.action.error}")
        return Turn(done=True, trajectory=self.trajectory)

    def step(self, action: Action) -> Turn:
        """Run one action; the observation it left, or the end (with the trajectory)."""
        if self._done.is_set():
            return Turn(done=True, trajectory=self.trajectory)
        return self.runner.portal.call(self._step, action)

    async def _step(self, action: Action) -> Turn:
        await self.bridge.actions.send(action)
        return await self._next()

    def close(self) -> None:
        """End the episode now if it is still running (aborted: never data)."""
        if not self._done.is_set():
            self.runner.portal.call(self._abort)

    async def _abort(self) -> None:
        self.control.abort_all()
        await self._done.wait()


def reward_or_none(trajectory: Trajectory) -> float | None:
    """The episode's reward when the scorer judged it, else None (never a reward)."""
    return float(trajectory.reward) if is_scored(trajectory) else None


def resolve(value: Any, what: str) -> Any:
    """A callable given as itself or as ``module:attribute`` (a trainer's config names it)."""
    if not isinstance(value, str):
        return value
    module, sep, attribute = value.partition(":")
    if not sep or not module or not attribute:
        raise ConfigError(f"{what}: give module:attribute, got {value!r}")
    return getattr(importlib.import_module(module), attribute)


def _generator(stream: AsyncIterator[Trajectory]) -> AsyncGenerator[Trajectory, None]:
    """``rollout``'s stream as what it is (an async generator), for ``contextlib.aclosing``."""
    return cast(AsyncGenerator[Trajectory, None], stream)

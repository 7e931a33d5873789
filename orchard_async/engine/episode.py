"""One attempt at an episode: its agent phase (``run_agent``: policy <-> sandbox turns under
the agent's share of the deadline), then its scoring (``score``).

The deadline sizes everything: the sandbox TTL (``plan.agent_spec``: deadline plus a margin,
so the sandbox outlives its verifier), each command's timeout (never past the agent's share),
and the time reserved for scoring. Infrastructure failures propagate as ``InfraError`` from
either phase, so the engine can retry the episode in a fresh sandbox; a policy's or a task's
own error ends the episode as failed, never retried.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel

from orchard_async.engine.control import RolloutControl
from orchard_async.engine.groups import Fork, GroupSetups, SharedSetup
from orchard_async.engine.phases import enter_phase
from orchard_async.engine.plan import Episode, agent_spec, forked_spec, graded_apart, scorer_spec
from orchard_async.engine.pool import Pool
from orchard_async.engine.recording import RecordingSandbox
from orchard_async.errors import ConfigError, ContextExhausted, InfraError, SandboxLost, VerifierError
from orchard_async.protocols import GradedApart, Policy, Sandbox, Task, tell_episode_ended
from orchard_async.records.trajectory import EndReason, Op, Step, Trajectory
from orchard_async.task import Observation, Reward
from orchard_async.types import ExecResult, ExitReason, SandboxSpec

OBSERVATION_LIMIT = 16_000  # characters of output kept in a step's observation


_INFRA = (ExitReason.SANDBOX_LOST, ExitReason.INFRA_ERROR)


def render(result: ExecResult, limit: int = OBSERVATION_LIMIT) -> str:
    """What the agent reads back: output, then the exit status when it is not plain success."""
    if result.reason is ExitReason.OK and not result.stderr and len(result.stdout) <= limit:
        return result.stdout.decode("utf-8", "replace")  # the common case, kept cheap
    text = result.text + result.error_text
    if len(text) > limit:
        half = limit // 2
        text = f"{text[:half]}\n[... {len(text) - limit} characters elided ...]\n{text[-half:]}"
    if not result.ok:
        text += f"\n[exit code {result.exit_code}: {result.reason.value}]"
    return text


@dataclass(slots=True)
class AgentOutcome:
    """What the agent phase leaves: why it ended (a scored end, or the policy's or the task's
    own failure), the steps, and where its time went."""

    end_reason: EndReason = EndReason.MAX_STEPS
    instruction: str = ""
    steps: list[Step] = field(default_factory=list)
    error: str = ""  # the failure that ended it, when one did (POLICY_ERROR, TASK_ERROR)
    setup: float | None = None  # seconds of the task's own setup; None when it started from a fork
    agent: float = 0.0  # seconds the policy took to act
    exec: float = 0.0  # seconds the commands took


@dataclass(slots=True)
class _AgentSandboxCloser:
    """Closes an attempt's agent sandbox once: after its scoring, or before a grade in a
    fresh sandbox (``score``'s ``close_agent``), whichever comes first. (An object, not a
    closure: a closure's cells are more objects per episode in flight for the collector to walk.)"""

    pool: Pool
    raw: Sandbox
    ops: list[Op]
    t0: float
    timings: dict[str, float]
    closed: bool = False

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            mark = time.monotonic()
            await self.pool.close_sandbox(self.raw)
            self.timings["destroy"] += time.monotonic() - mark
            self.ops.append(Op("destroy", mark - self.t0, time.monotonic() - mark))


async def run_attempt(
    episode: Episode,
    policy: Policy,
    pool: Pool,
    *,
    run_id: str,
    attempt: int = 0,
    groups: GroupSetups | None = None,
    control: RolloutControl | None = None,
) -> Trajectory:
    """Run the episode once: its agent phase, then, when it ended in a way the scorer can
    judge, its scoring. Raises InfraError when the backend fails; everything else ends up in
    the returned trajectory. With ``groups``, a task that opts in starts from its group's
    snapshot and skips setup (see ``groups``); with ``control``, a trainer may pause it at
    its turn boundaries (see ``control``)."""
    task = episode.task
    t0 = time.monotonic()
    started_at = time.time()
    ops: list[Op] = []
    timings = {"create": 0.0, "setup": 0.0, "agent": 0.0, "exec": 0.0, "score": 0.0, "destroy": 0.0}
    if control is None:
        spec = agent_spec(episode, attempt)
    else:
        spec = agent_spec(episode, attempt, control.pause_allowance, control.max_pause)
    outcome = AgentOutcome()
    reward = Reward(value=0.0, success=False)

    fork = None
    if groups is not None:
        shared = SharedSetup()
        fork = await groups.start(episode, spec, ops, t0, shared)
        timings["create"], timings["setup"], timings["destroy"] = shared.create, shared.setup, shared.destroy
        waited = time.monotonic() - t0 - shared.create - shared.setup - shared.destroy
        if fork is not None and waited > 0.0005:  # for another sample's base: its own phase, not setup
            timings["group_wait"] = waited
    start = time.monotonic()
    # A failure here is an InfraError: the engine records the retry.
    raw = await pool.acquire(spec if fork is None else forked_spec(spec, fork.snapshot))
    timings["create"] += time.monotonic() - start
    ops.append(Op("create", start - t0, time.monotonic() - start, "fork" if fork else "ok"))
    t_agent = time.monotonic() if fork else t0  # the group's shared setup is not this sample's budget
    sandbox = RecordingSandbox(raw, ops, t0)
    closer = _AgentSandboxCloser(pool, raw, ops, t0, timings)
    try:
        outcome = await run_agent(
            episode,
            policy,
            sandbox,
            deadline=t_agent + task.deadline - task.score_timeout,
            fork=fork,
            control=control,
        )
        if outcome.setup is not None:
            timings["setup"] = outcome.setup
        timings["agent"] += outcome.agent
        timings["exec"] += outcome.exec
        if outcome.end_reason.scored:
            mark = time.monotonic()
            try:
                reward = await score(task, sandbox, pool=pool, spec=spec, close_agent=closer.close)
            finally:
                timings["score"] = time.monotonic() - mark - timings["destroy"]
    except InfraError:
        raise
    except Exception as exc:  # scoring failed for a reason of the task's own, outside its verifier
        outcome.end_reason, outcome.error = EndReason.TASK_ERROR, f"{type(exc).__name__}: {exc}"
    finally:
        tell_episode_ended(policy, episode.episode_id)
        await closer.close()
    timings["total"] = time.monotonic() - t0
    return Trajectory(
        episode_id=episode.episode_id,
        task_id=task.id,
        group_id=episode.group_id,
        sample=episode.sample,
        policy=policy.name,
        adapter=pool.adapter.name,
        run_id=run_id,
        status="finished" if outcome.end_reason.scored else "failed",
        end_reason=outcome.end_reason,
        reward=reward.value,
        success=reward.success,
        instruction=outcome.instruction,
        steps=outcome.steps,
        ops=ops,
        timings=timings,
        info=reward.info,
        error=outcome.error,
        started_at=started_at,
        forked_from=fork.snapshot if fork else "",
    )


async def run_agent(
    episode: Episode,
    policy: Policy,
    sandbox: RecordingSandbox,
    *,
    deadline: float,
    fork: Fork | None = None,
    control: RolloutControl | None = None,
) -> AgentOutcome:
    """The agent phase, until ``deadline`` (monotonic seconds): the task's setup (or, for a
    sample of a forked group, its fork's instruction), then the policy's actions run in the
    sandbox until the policy submits or cannot go on, the task's step budget or parse-failure
    limit is reached, or the deadline passes. Raises InfraError (the attempt is retried); a
    failure of the policy's or the task's own ends the phase, recorded in the outcome. With
    ``control``, each turn begins at a boundary where a trainer's pause holds it (the
    deadline moves on by the time paused) and its step records the weight version then."""
    task = episode.task
    raw = sandbox.inner  # the steps' commands go straight to it: each step records its own timing
    outcome = AgentOutcome()
    steps = outcome.steps
    try:
        # One cancel scope for the whole agent phase (a timer per step costs more than a step);
        # a bare CancelScope: move_on_after/fail_after add a generator context manager each.
        with anyio.CancelScope(deadline=anyio.current_time() + deadline - time.monotonic()) as agent_phase:
            mark = time.monotonic()
            if fork is not None:
                outcome.instruction = fork.instruction_for(raw)
            else:
                try:
                    await enter_phase(task, "setup", raw, sandbox.ops, sandbox.t0)
                    outcome.instruction = await task.setup(sandbox)
                finally:
                    outcome.setup = time.monotonic() - mark
            await enter_phase(task, "agent", raw, sandbox.ops, sandbox.t0)
            # Replies in a row that were not actions; at the task's limit (if it sets one) the episode ends.
            parse_failure_limit = getattr(task, "parse_failure_limit", 0) or 0
            parse_failures = 0
            version = ""
            for index in range(task.max_steps):
                if control is not None:
                    if control.paused:  # the time paused is not the agent's: its deadline waits too
                        phase_deadline, agent_phase.deadline = agent_phase.deadline, math.inf
                        paused, overran = await control.turn_boundary(episode.episode_id, sandbox)
                        deadline += paused
                        agent_phase.deadline = phase_deadline + paused
                        if overran:  # its sandbox's TTL no longer covers the rest: abort it
                            control.abort(episode.episode_id)
                            await anyio.lowlevel.checkpoint()
                    version = control.weight_version
                mark = time.monotonic()
                observation = Observation(episode.episode_id, task, outcome.instruction, index, steps, deadline - mark)
                try:
                    action = await policy.act(observation)
                except InfraError:
                    raise
                except ContextExhausted:  # the agent cannot go on; what it left is still scored
                    outcome.agent += time.monotonic() - mark
                    outcome.end_reason = EndReason.CONTEXT_EXHAUSTED
                    break
                except Exception as exc:  # the policy's own failure: recorded, never retried
                    outcome.end_reason, outcome.error = EndReason.POLICY_ERROR, f"{type(exc).__name__}: {exc}"
                    break
                agent_s = time.monotonic() - mark
                outcome.agent += agent_s
                if action.kind == "submit":
                    steps.append(Step(index=index, action=action, agent_s=agent_s, weight_version=version))
                    outcome.end_reason = EndReason.SUBMITTED
                    break
                if action.kind == "invalid":
                    steps.append(
                        Step(
                            index=index,
                            action=action,
                            observation=f"error: {action.error}",
                            agent_s=agent_s,
                            weight_version=version,
                        )
                    )
                    parse_failures += 1
                    if parse_failure_limit and parse_failures >= parse_failure_limit:
                        outcome.end_reason = EndReason.PARSE_FAILURES
                        break
                    continue
                parse_failures = 0
                timeout = max(0.001, min(task.exec_timeout, deadline - time.monotonic()))
                result = await raw.exec(action.command, timeout=timeout)
                outcome.exec += result.duration
                if result.reason in _INFRA:  # a tuple test; ExitReason.is_infra is a property call
                    raise SandboxLost(f"step {index}: {result.error_text or result.reason.value}")
                steps.append(
                    Step(
                        index=index,
                        action=action,
                        observation=render(result),
                        exit_code=result.exit_code,
                        reason=result.reason,  # a StrEnum: stored and encoded as its value
                        agent_s=agent_s,
                        exec_s=result.duration,
                        stdout_cut=result.stdout_cut,
                        stderr_cut=result.stderr_cut,
                        weight_version=version,
                    )
                )
    except InfraError:
        raise
    except Exception as exc:  # the task's setup (or a call into its sandbox) failed for a reason of its own
        outcome.end_reason, outcome.error = EndReason.TASK_ERROR, f"{type(exc).__name__}: {exc}"
        return outcome
    if agent_phase.cancelled_caught:
        outcome.end_reason = EndReason.DEADLINE
    return outcome


async def score(
    task: Task,
    sandbox: RecordingSandbox,
    *,
    pool: Pool,
    spec: SandboxSpec,
    close_agent: Callable[[], Awaitable[None]],
) -> Reward:
    """The scoring phase: the task's verdict on what the agent left in ``sandbox``. A
    ``GradedApart`` task's submission is read, the agent's sandbox closed (``close_agent``)
    and the grade given in a fresh sandbox of ``spec``'s scorer role from ``pool``. Raises
    VerifierError when there is no verdict to give (retried like any InfraError)."""
    if graded_apart(task):
        return await _grade_apart(task, sandbox, pool, spec, close_agent)
    await enter_phase(task, "scoring", sandbox.inner, sandbox.ops, sandbox.t0)
    return await _evaluate(task, sandbox)


async def _evaluate(task: Task, sandbox: RecordingSandbox) -> Reward:
    """The task's verdict, or VerifierError when there is none to give: a grader that
    crashed or overran its time judged nothing, and that must never read as reward 0."""
    try:
        with anyio.CancelScope(deadline=anyio.current_time() + task.score_timeout) as scoring:
            reward = await task.evaluate(sandbox)
    except InfraError:
        raise
    except Exception as exc:
        raise VerifierError(f"the verifier crashed: {type(exc).__name__}: {exc}") from exc
    if scoring.cancelled_caught:
        raise VerifierError(f"scoring took longer than the task's score_timeout ({task.score_timeout:.0f}s)")
    return reward


async def _grade_apart(
    task: GradedApart,
    sandbox: RecordingSandbox,
    pool: Pool,
    spec: SandboxSpec,
    close_agent: Callable[[], Awaitable[None]],
) -> Reward:
    """Read the submission, destroy the agent's sandbox (and all it left running), then
    grade in a fresh one. The fresh sandbox's create counts as scoring time."""
    budget = anyio.current_time() + task.score_timeout  # type: ignore[attr-defined]
    refused: ConfigError | None = None  # the scorer's network cannot be switched: the task's error, not retried
    with anyio.CancelScope(deadline=budget) as scoring:
        try:
            submission = await task.submission(sandbox)
            await close_agent()
            start = time.monotonic()
            scorer = await pool.acquire(scorer_spec(spec, task))
            sandbox.ops.append(Op("create", start - sandbox.t0, time.monotonic() - start, "scorer"))
            try:
                try:
                    await enter_phase(task, "scoring", scorer, sandbox.ops, sandbox.t0)  # type: ignore[arg-type]
                except ConfigError as exc:
                    refused = exc
                else:
                    reward = await task.grade(submission, RecordingSandbox(scorer, sandbox.ops, sandbox.t0))
            finally:
                await pool.close_sandbox(scorer)
        except InfraError:
            raise
        except Exception as exc:
            raise VerifierError(f"the verifier crashed: {type(exc).__name__}: {exc}") from exc
    if refused is not None:
        raise refused
    if scoring.cancelled_caught:
        raise VerifierError(f"scoring took longer than the task's score_timeout ({task.score_timeout:.0f}s)")  # type: ignore[attr-defined]
    return reward

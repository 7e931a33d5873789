"""One episode: policy <-> sandbox turns under one deadline, then scoring.

The deadline sizes everything: the sandbox TTL (deadline plus a margin, so the sandbox
outlives its verifier), each command's timeout (never past the agent's share), and the
time reserved for ``evaluate``. Infrastructure failures propagate as ``InfraError`` so
the engine can retry the episode in a fresh sandbox; a policy's or a task's own error
ends the episode as failed, never retried.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec

from orchard_async.engine.groups import GroupSetups, SharedSetup
from orchard_async.engine.pool import Pool
from orchard_async.errors import ContextExhausted, InfraError, SandboxLost, VerifierError
from orchard_async.kit import labels as names
from orchard_async.protocols import GradedApart, Policy, Sandbox, Task
from orchard_async.records.trajectory import EndReason, Op, Step, Trajectory
from orchard_async.task import Observation, Reward
from orchard_async.types import ExecResult, ExitReason

TTL_MARGIN = 120.0  # the sandbox lives this much past the episode deadline
OBSERVATION_LIMIT = 16_000  # characters of output kept in a step's observation


@dataclass(frozen=True, slots=True)
class Episode:
    """One planned episode: which task, which GRPO group, which sample in the group."""

    episode_id: str
    task: Task
    group_id: str
    sample: int


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


class RecordingSandbox:
    """Passes every call through to the sandbox and times it into the trajectory's ops."""

    def __init__(self, inner: Sandbox, ops: list[Op], t0: float):
        self._inner = inner
        self._ops = ops
        self._t0 = t0
        self.id = inner.id
        self.workdir = inner.workdir
        self.labels = inner.labels

    async def _timed(self, name: str, call: Any) -> Any:
        start = time.monotonic()
        try:
            result = await call
        except BaseException as exc:
            self._ops.append(Op(name, start - self._t0, time.monotonic() - start, type(exc).__name__))
            raise
        outcome = result.reason.value if isinstance(result, ExecResult) else "ok"
        self._ops.append(Op(name, start - self._t0, time.monotonic() - start, outcome))
        return result

    async def exec(self, cmd: str, **kwargs: Any) -> ExecResult:
        return await self._timed("exec", self._inner.exec(cmd, **kwargs))

    async def read_file(self, path: str) -> bytes:
        return await self._timed("read_file", self._inner.read_file(path))

    async def write_file(self, path: str, data: bytes | str, **kwargs: Any) -> None:
        return await self._timed("write_file", self._inner.write_file(path, data, **kwargs))

    async def list_dir(self, path: str = ".") -> Any:
        return await self._timed("list_dir", self._inner.list_dir(path))

    async def apply_patch(self, patch: str | bytes, **kwargs: Any) -> ExecResult:
        return await self._timed("apply_patch", self._inner.apply_patch(patch, **kwargs))

    def session(self) -> Any:
        return self._inner.session()

    async def open_stream(self, argv: Sequence[str]) -> Any:
        return await self._timed("open_stream", self._inner.open_stream(argv))

    async def connect(self, port: int) -> Any:
        return await self._timed("connect", self._inner.connect(port))

    async def close(self) -> None:
        await self._inner.close()

    async def __aenter__(self) -> RecordingSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def run_attempt(
    episode: Episode, policy: Policy, pool: Pool, *, run_id: str, attempt: int = 0, groups: GroupSetups | None = None
) -> Trajectory:
    """Run the episode once. Raises InfraError when the backend fails; everything else
    ends up in the returned trajectory. With ``groups``, a task that opts in starts from
    its group's snapshot and skips setup (see ``groups``)."""
    task = episode.task
    t0 = time.monotonic()
    started_at = time.time()
    ops: list[Op] = []
    steps: list[Step] = []
    timings = {"create": 0.0, "setup": 0.0, "agent": 0.0, "exec": 0.0, "score": 0.0, "destroy": 0.0}
    spec = msgspec.structs.replace(
        task.spec,
        ttl=task.deadline + TTL_MARGIN,
        labels={
            **task.spec.labels,
            names.EPISODE: _label_safe(episode.episode_id),
            names.ATTEMPT: str(attempt),
        },
    )
    status, error, instruction = "finished", "", ""
    end_reason = EndReason.MAX_STEPS
    reward = Reward(value=0.0, success=False)

    fork, shared = None, SharedSetup()
    if groups is not None:
        fork = await groups.start(episode, spec, ops, t0, shared)
        timings["create"], timings["setup"], timings["destroy"] = shared.create, shared.setup, shared.destroy
        waited = time.monotonic() - t0 - shared.create - shared.setup - shared.destroy
        if fork is not None and waited > 0.0005:  # for another sample's base: its own phase, not setup
            timings["group_wait"] = waited
    start = time.monotonic()
    # A failure here is an InfraError: the engine records the retry.
    raw = await pool.acquire(spec if fork is None else msgspec.structs.replace(spec, snapshot=fork.snapshot))
    timings["create"] += time.monotonic() - start
    ops.append(Op("create", start - t0, time.monotonic() - start, "fork" if fork else "ok"))
    t_agent = time.monotonic() if fork else t0  # the group's shared setup is not this sample's budget
    sandbox = RecordingSandbox(raw, ops, t0)
    agent_closed = False

    async def close_agent_sandbox() -> None:
        nonlocal agent_closed
        if not agent_closed:
            agent_closed = True
            mark = time.monotonic()
            await pool.close_sandbox(raw)
            timings["destroy"] += time.monotonic() - mark
            ops.append(Op("destroy", mark - t0, time.monotonic() - mark))

    try:
        agent_deadline = t_agent + task.deadline - task.score_timeout
        # One cancel scope for the whole agent phase (a timer per step costs more than a step);
        # a bare CancelScope: move_on_after/fail_after add a generator context manager each.
        with anyio.CancelScope(deadline=anyio.current_time() + agent_deadline - time.monotonic()) as agent_phase:
            mark = time.monotonic()
            if fork is not None:
                instruction = fork.instruction_for(raw)
            else:
                try:
                    instruction = await task.setup(sandbox)
                finally:
                    timings["setup"] = time.monotonic() - mark
            # Replies in a row that were not actions; at the task's limit (if it sets one) the episode ends.
            parse_failure_limit = getattr(task, "parse_failure_limit", 0) or 0
            parse_failures = 0
            for index in range(task.max_steps):
                mark = time.monotonic()
                observation = Observation(episode.episode_id, task, instruction, index, steps, agent_deadline - mark)
                try:
                    action = await policy.act(observation)
                except InfraError:
                    raise
                except ContextExhausted:  # the agent cannot go on; what it left is still scored
                    timings["agent"] += time.monotonic() - mark
                    end_reason = EndReason.CONTEXT_EXHAUSTED
                    break
                except Exception as exc:  # the policy's own failure: recorded, never retried
                    status, end_reason, error = "failed", EndReason.POLICY_ERROR, f"{type(exc).__name__}: {exc}"
                    break
                agent_s = time.monotonic() - mark
                timings["agent"] += agent_s
                if action.kind == "submit":
                    steps.append(Step(index=index, action=action, agent_s=agent_s))
                    end_reason = EndReason.SUBMITTED
                    break
                if action.kind == "invalid":
                    steps.append(
                        Step(index=index, action=action, observation=f"error: {action.error}", agent_s=agent_s)
                    )
                    parse_failures += 1
                    if parse_failure_limit and parse_failures >= parse_failure_limit:
                        end_reason = EndReason.PARSE_FAILURES
                        break
                    continue
                parse_failures = 0
                timeout = max(0.001, min(task.exec_timeout, agent_deadline - time.monotonic()))
                # Straight to the sandbox: the step itself records this command's timing.
                result = await raw.exec(action.command, timeout=timeout)
                timings["exec"] += result.duration
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
                    )
                )
        if agent_phase.cancelled_caught:
            end_reason = EndReason.DEADLINE
        if status == "finished":
            mark = time.monotonic()
            try:
                if isinstance(task, GradedApart):
                    reward = await _grade_apart(task, sandbox, pool, spec, ops, t0, close_agent_sandbox)
                else:
                    reward = await _evaluate(task, sandbox)
            finally:
                timings["score"] = time.monotonic() - mark - timings["destroy"]
    except InfraError:
        raise
    except Exception as exc:  # setup or evaluate failed for a reason of the task's own
        status, end_reason, error = "failed", EndReason.TASK_ERROR, f"{type(exc).__name__}: {exc}"
    finally:
        await close_agent_sandbox()
    timings["total"] = time.monotonic() - t0
    return Trajectory(
        episode_id=episode.episode_id,
        task_id=task.id,
        group_id=episode.group_id,
        sample=episode.sample,
        policy=policy.name,
        adapter=getattr(pool.adapter, "name", "?"),
        run_id=run_id,
        status=status,
        end_reason=end_reason,
        reward=reward.value,
        success=reward.success,
        instruction=instruction,
        steps=steps,
        ops=ops,
        timings=timings,
        info=reward.info,
        error=error,
        started_at=started_at,
        forked_from=fork.snapshot if fork else "",
    )


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
    task: GradedApart, sandbox: RecordingSandbox, pool: Pool, spec: Any, ops: list[Op], t0: float, close_agent: Any
) -> Reward:
    """Read the submission, destroy the agent's sandbox (and all it left running), then
    grade in a fresh one. The fresh sandbox's create counts as scoring time."""
    budget = anyio.current_time() + task.score_timeout  # type: ignore[attr-defined]
    with anyio.CancelScope(deadline=budget) as scoring:
        try:
            submission = await task.submission(sandbox)
            await close_agent()
            start = time.monotonic()
            scorer = await pool.acquire(msgspec.structs.replace(spec, labels={**spec.labels, names.ROLE: "scorer"}))
            ops.append(Op("create", start - t0, time.monotonic() - start, "scorer"))
            try:
                reward = await task.grade(submission, RecordingSandbox(scorer, ops, t0))
            finally:
                await pool.close_sandbox(scorer)
        except InfraError:
            raise
        except Exception as exc:
            raise VerifierError(f"the verifier crashed: {type(exc).__name__}: {exc}") from exc
    if scoring.cancelled_caught:
        raise VerifierError(f"scoring took longer than the task's score_timeout ({task.score_timeout:.0f}s)")  # type: ignore[attr-defined]
    return reward


_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def _label_safe(value: str) -> str:
    cleaned = _LABEL_UNSAFE.sub("-", value)
    return cleaned[-63:].strip("-_.") or "episode"

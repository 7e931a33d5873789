"""The rollout engine on the sim adapter: retries, accounting, cancellation, resume."""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async.adapters.sim import Latency, SimAdapter, SimConfig
from orchard_async.capabilities import AdapterFacts


@dataclass
class CountTask:
    """Runs ``steps`` commands; succeeds when all ran."""

    id: str
    steps: int = 5
    spec: oa.SandboxSpec = field(default_factory=oa.SandboxSpec)
    max_steps: int = 50
    deadline: float = 60.0
    score_timeout: float = 5.0
    exec_timeout: float = 5.0

    async def setup(self, sandbox: oa.Sandbox) -> str:
        await sandbox.write_file("goal", str(self.steps))
        return f"run {self.steps} commands"

    async def evaluate(self, sandbox: oa.Sandbox) -> oa.Reward:
        await sandbox.read_file("goal")
        return oa.Reward(value=1.0, success=True)


class StepsPolicy:
    name = "steps"

    async def act(self, observation: oa.Observation) -> oa.Action:
        if observation.step < observation.task.steps:  # type: ignore[attr-defined]
            return oa.Action(command=f"echo {observation.step}")
        return oa.Action(kind="submit")


def tasks(count: int = 4, steps: int = 5) -> list[CountTask]:
    return [CountTask(f"t{i}", steps=steps) for i in range(count)]


async def drain(tasks, policy, adapter, **kwargs) -> list[oa.Trajectory]:
    """All trajectories of a rollout, with backoffs shortened so fault tests stay fast."""
    pool = oa.Pool(adapter, max_backoff=0.05)
    kwargs.setdefault("retry_backoff", 0.01)
    async with contextlib.aclosing(oa.rollout(tasks, policy, pool, **kwargs)) as stream:
        return [t async for t in stream]


def assert_accounted(results: list[oa.Trajectory], expected: int) -> None:
    ids = [t.episode_id for t in results]
    assert len(ids) == expected and len(set(ids)) == expected, "an episode was lost or duplicated"
    for t in results:
        assert t.status == "finished" or (t.status == "failed" and t.end_reason and t.error)
        # Every end the engine produces is one EndReason names; finished means scored.
        assert t.end_reason in set(oa.EndReason), f"{t.end_reason!r} is not an EndReason"
        assert isinstance(t.end_reason, oa.EndReason) and all(isinstance(r.reason, oa.EndReason) for r in t.retries)
        assert oa.EndReason(t.end_reason).scored == (t.status == "finished"), t
        assert all(oa.EndReason(retry.reason).is_infra for retry in t.retries), t.retries


async def test_plan_groups_and_validation() -> None:
    episodes = oa.plan(tasks(3), n=12, group_size=4)
    assert [e.task.id for e in episodes[:8]] == ["t0"] * 4 + ["t1"] * 4
    assert len({e.episode_id for e in episodes}) == 12
    assert Counter(e.group_id for e in episodes) == {f"t{g % 3}/g{g}": 4 for g in range(3)}
    with pytest.raises(oa.ConfigError, match="multiple"):
        oa.plan(tasks(), n=10, group_size=4)
    with pytest.raises(oa.ConfigError):
        oa.plan([], n=1)


async def test_clean_rollout_finishes_everything() -> None:
    adapter = SimAdapter(SimConfig(exec_latency=Latency.parse("uniform:0,0.002")))
    results = await drain(tasks(), StepsPolicy(), adapter, n=40, group_size=2, concurrency=16)
    assert_accounted(results, 40)
    assert all(t.success and t.end_reason == "submitted" and len(t.steps) == 6 for t in results)
    assert adapter.created == adapter.destroyed == 40 and not adapter.live


async def test_create_failures_are_retried_then_reported() -> None:
    adapter = SimAdapter(SimConfig(seed=7, create_failure_rate=0.5))
    results = await drain(tasks(), StepsPolicy(), adapter, n=200, concurrency=32, max_retries=2)
    assert_accounted(results, 200)
    failed = [t for t in results if t.status == "failed"]
    retried_ok = [t for t in results if t.status == "finished" and t.retries]
    assert failed and retried_ok, "with p=0.5 some episodes must recover and some must give up"
    for t in failed:
        assert t.end_reason == "create_failed" and len(t.retries) == 3
    for t in retried_ok:
        assert 1 <= len(t.retries) <= 2 and all(r.reason == "create_failed" for r in t.retries)
    assert not adapter.live


async def test_dying_sandboxes_are_retried_in_a_fresh_sandbox() -> None:
    adapter = SimAdapter(SimConfig(seed=3, death_rate=0.08))
    results = await drain(tasks(steps=10), StepsPolicy(), adapter, n=100, concurrency=20, max_retries=1)
    assert_accounted(results, 100)
    lost = [t for t in results if t.status == "failed"]
    assert lost and all(t.end_reason == "sandbox_lost" and len(t.retries) == 2 for t in lost)
    assert any(t.status == "finished" and t.retries for t in results)
    assert adapter.created == adapter.destroyed and not adapter.live


async def test_outage_backs_off_and_recovers() -> None:
    adapter = SimAdapter(SimConfig(outage=(5, 15)))
    results = await drain(tasks(), StepsPolicy(), adapter, n=20, concurrency=4, max_retries=5)
    assert_accounted(results, 20)
    assert all(t.status == "finished" for t in results)
    assert sum(len(t.retries) for t in results) == 10  # exactly the creates in the outage window


async def test_hanging_commands_time_out_without_hanging_the_rollout() -> None:
    @dataclass
    class Quick(CountTask):
        exec_timeout: float = 0.05

    adapter = SimAdapter(SimConfig(seed=1, exec_hang_rate=0.3))
    results = await drain([Quick("q", steps=3)], StepsPolicy(), adapter, n=30, concurrency=30)
    assert_accounted(results, 30)
    reasons = Counter(step.reason for t in results for step in t.steps if step.reason)
    assert reasons["timeout"] > 0 and reasons["ok"] > 0


async def test_policy_errors_are_not_retried() -> None:
    class Broken:
        name = "broken"

        async def act(self, observation: oa.Observation) -> oa.Action:
            raise RuntimeError("model returned garbage")

    adapter = SimAdapter()
    results = await drain(tasks(), Broken(), adapter, n=4)
    assert all(t.end_reason == "policy_error" and not t.retries and "garbage" in t.error for t in results)
    assert not adapter.live


async def test_a_policy_is_told_when_each_episode_ends_however_it_ends() -> None:
    """A policy that keeps something per episode (a token context, screenshots, a harness
    run) is told once each attempt is over, so the run does not keep it: here episodes end
    by their step budget, their deadline, the policy's own error and a submit, and some
    sandboxes die mid-way (the attempt is retried in a fresh one)."""

    @dataclass
    class Ending(CountTask):
        ends: str = "submit"
        max_steps: int = 4
        deadline: float = 0.4
        score_timeout: float = 0.1

    class Keeping:
        name = "keeping"

        def __init__(self) -> None:
            self.kept: dict[str, int] = {}
            self.acted: set[str] = set()
            self.ended: Counter[str] = Counter()

        async def act(self, observation: oa.Observation) -> oa.Action:
            self.kept[observation.episode_id] = observation.step
            self.acted.add(observation.episode_id)
            ends = observation.task.ends  # type: ignore[attr-defined]
            if ends == "error" and observation.step == 1:
                raise RuntimeError("the model broke")
            if ends == "deadline":
                await anyio.sleep(1)
            if ends == "submit" and observation.step == 2:
                return oa.Action(kind="submit")
            return oa.Action(command=f"echo {observation.step}")

        def episode_ended(self, episode_id: str) -> None:
            self.ended[episode_id] += 1
            self.kept.pop(episode_id, None)

    endings = ("max_steps", "deadline", "error", "submit")
    policy = Keeping()
    adapter = SimAdapter(SimConfig(seed=3, death_rate=0.05))
    results = await drain([Ending(f"t-{end}", ends=end) for end in endings], policy, adapter, n=40, concurrency=40)
    assert_accounted(results, 40)
    reasons = Counter(t.end_reason for t in results)
    assert {"max_steps", "deadline", "policy_error", "submitted"} <= set(reasons), reasons
    assert any(t.retries for t in results), "some sandboxes should have died mid-way"
    assert not policy.kept, f"{len(policy.kept)} episodes' state outlived them"
    assert set(policy.ended) == policy.acted
    for t in results:  # once per attempt that reached the policy, never more
        assert 1 <= policy.ended[t.episode_id] <= 1 + len(t.retries)
    assert not adapter.live


async def test_replies_that_are_not_actions_end_the_episode_at_the_tasks_limit() -> None:
    """Invalid replies are steps the policy is told about; the task's parse_failure_limit of
    them in a row ends the episode as parse_failures, scored, never retried. A valid action
    resets the count; a task without a limit lets them run to max_steps."""

    @dataclass
    class Strict(CountTask):
        parse_failure_limit: int = 3
        max_steps: int = 20

    class Babbler:
        name = "babbler"

        def __init__(self, script: str):
            self.script = script  # one letter per step: a = a valid action, x = a reply that is not one

        async def act(self, observation: oa.Observation) -> oa.Action:
            if observation.step >= len(self.script):
                return oa.Action(kind="submit")
            if self.script[observation.step] == "a":
                return oa.Action(command=f"echo {observation.step}")
            return oa.Action(kind="invalid", raw="hmm", error="no action found")

    adapter = SimAdapter()
    (ended,) = await drain([Strict("s")], Babbler("xxaxxxaaa"), adapter, n=1)
    assert_accounted([ended], 1)
    assert ended.status == "finished" and ended.end_reason == "parse_failures" and not ended.retries
    assert [step.action.kind for step in ended.steps] == ["invalid", "invalid", "exec", "invalid", "invalid", "invalid"]
    assert ended.steps[-1].observation == "error: no action found" and ended.success  # scored on what it left
    assert oa.EndReason(ended.end_reason).scored and not oa.EndReason(ended.end_reason).is_infra

    (recovered,) = await drain([Strict("s")], Babbler("xxaxxa"), adapter, n=1)
    assert recovered.end_reason == "submitted" and len(recovered.steps) == 7
    (unlimited,) = await drain([CountTask("u", max_steps=6)], Babbler("x" * 10), adapter, n=1)
    assert unlimited.end_reason == "max_steps" and len(unlimited.steps) == 6
    assert not adapter.live


async def test_deadline_reserves_time_for_scoring() -> None:
    @dataclass
    class Slow(CountTask):
        deadline: float = 0.5
        score_timeout: float = 0.2

    adapter = SimAdapter(SimConfig(exec_latency=Latency.parse("const:0.05")))
    (result,) = await drain([Slow("slow", steps=1000)], StepsPolicy(), adapter, n=1)
    assert result.end_reason == "deadline" and result.status == "finished" and result.success
    assert result.timings["total"] < 0.5 + 0.2


async def test_cancel_mid_way_destroys_everything_and_resume_completes(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    adapter = SimAdapter(SimConfig(exec_latency=Latency.parse("const:0.01")))
    seen = 0

    def stop_after_some(trajectory: oa.Trajectory) -> None:
        nonlocal seen
        seen += 1
        if seen == 15:
            scope.cancel()  # what Ctrl-C does to the running rollout

    with anyio.CancelScope() as scope:
        await oa.collect(tasks(), StepsPolicy(), adapter, out, n=60, concurrency=10, on_trajectory=stop_after_some)
    assert scope.cancelled_caught
    assert not adapter.live and adapter.created == adapter.destroyed
    first = list(oa.read_trajectories(out, strict=True))
    assert len(first) == 15

    with pytest.raises(oa.ConfigError, match="resume"):
        await oa.collect(tasks(), StepsPolicy(), adapter, out, n=60)
    summary = await oa.collect(tasks(), StepsPolicy(), adapter, out, resume=True, n=60, concurrency=10)
    assert (summary.skipped, summary.written) == (15, 45)
    everything = list(oa.read_trajectories(out, strict=True))
    assert sorted(t.episode_id for t in everything) == sorted(e.episode_id for e in oa.plan(tasks(), 60))
    again = await oa.collect(tasks(), StepsPolicy(), adapter, out, resume=True, n=60)
    assert again.written == 0


@pytest.mark.soak  # long: the default run leaves it to `pytest -m soak` (CI runs both)
async def test_ten_thousand_concurrent_episodes_complete() -> None:
    adapter = SimAdapter()
    count = 0
    async for trajectory in oa.rollout(tasks(100, steps=20), StepsPolicy(), adapter, n=10_000, concurrency=10_000):
        assert trajectory.success
        count += 1
    assert count == 10_000 and not adapter.live and adapter.destroyed == 10_000


async def test_sim_is_deterministic_per_seed() -> None:
    async def reasons(seed: int) -> list[tuple[str, str]]:
        adapter = SimAdapter(SimConfig(seed=seed, death_rate=0.05, create_failure_rate=0.2))
        results = await drain(tasks(), StepsPolicy(), adapter, n=40, concurrency=13, max_retries=1)
        return sorted((t.episode_id, t.end_reason) for t in results)

    assert await reasons(11) == await reasons(11)
    assert await reasons(11) != await reasons(12)


async def test_a_verifier_over_its_time_fails_the_episode_clearly() -> None:
    @dataclass
    class SlowVerifier(CountTask):
        score_timeout: float = 0.1

        async def evaluate(self, sandbox: oa.Sandbox) -> oa.Reward:
            await anyio.sleep(5)
            return oa.Reward(value=1.0, success=True)

    adapter = SimAdapter()
    (result,) = await drain([SlowVerifier("v", steps=1)], StepsPolicy(), adapter, n=1, max_retries=1)
    # A grader that ran out of time judged nothing: an infrastructure reason, retried, never a reward.
    assert (result.status, result.end_reason, result.success) == ("failed", "verifier_error", False)
    assert "score_timeout" in result.error and len(result.retries) == 2 and not adapter.live


# -- one attempt's two phases (engine/episode.py) -----------------------------------------------


async def _agent_phase(task: CountTask, policy: object) -> tuple[list[oa.Op], object]:
    from orchard_async.engine.episode import run_agent
    from orchard_async.engine.plan import Episode
    from orchard_async.engine.recording import RecordingSandbox

    adapter, ops = SimAdapter(SimConfig(exec_latency=Latency.parse("const:0.01"))), []
    async with await adapter.create(oa.SandboxSpec()) as raw:
        outcome = await run_agent(
            Episode("e", task, "g", 0), policy, RecordingSandbox(raw, ops, 0.0), deadline=anyio.current_time() + 30
        )
    return ops, outcome


async def test_the_agent_phase_ends_in_its_outcome_and_only_infrastructure_raises() -> None:
    ops, outcome = await _agent_phase(CountTask("t", steps=2), StepsPolicy())
    assert outcome.end_reason is oa.EndReason.SUBMITTED and outcome.instruction == "run 2 commands"
    assert [step.action.kind for step in outcome.steps] == ["exec", "exec", "submit"] and not outcome.error
    assert outcome.setup is not None and outcome.exec >= 0.02 and [op.name for op in ops] == ["write_file"]

    class Broken:
        name = "broken"

        async def act(self, observation: oa.Observation) -> oa.Action:
            raise RuntimeError("garbage")

    _, outcome = await _agent_phase(CountTask("t"), Broken())
    assert (outcome.end_reason, outcome.error) == (oa.EndReason.POLICY_ERROR, "RuntimeError: garbage")

    @dataclass
    class BadSetup(CountTask):
        async def setup(self, sandbox: oa.Sandbox) -> str:
            raise ValueError("no repo")

    _, outcome = await _agent_phase(BadSetup("t"), StepsPolicy())
    assert (outcome.end_reason, outcome.error, outcome.steps) == (oa.EndReason.TASK_ERROR, "ValueError: no repo", [])

    class Offline:
        name = "offline"

        async def act(self, observation: oa.Observation) -> oa.Action:
            raise oa.ModelUnavailable("the model server is down")

    with pytest.raises(oa.ModelUnavailable):
        await _agent_phase(CountTask("t"), Offline())


async def test_scoring_gives_the_tasks_verdict_or_a_verifier_error() -> None:
    from orchard_async.engine.episode import score
    from orchard_async.engine.recording import RecordingSandbox

    @dataclass
    class Crashing(CountTask):
        async def evaluate(self, sandbox: oa.Sandbox) -> oa.Reward:
            raise KeyError("results.xml")

    adapter = SimAdapter()
    pool = oa.Pool(adapter)
    async with pool.sandbox(oa.SandboxSpec()) as raw:
        await raw.write_file("goal", "1")
        sandbox = RecordingSandbox(raw, [], 0.0)

        async def close_agent() -> None:
            raise AssertionError("only a GradedApart task closes the agent's sandbox to score")

        reward = await score(CountTask("t"), sandbox, pool=pool, spec=oa.SandboxSpec(), close_agent=close_agent)
        assert reward.success and [op.name for op in sandbox.ops] == ["read_file"]
        with pytest.raises(oa.VerifierError, match="KeyError"):
            await score(Crashing("t"), sandbox, pool=pool, spec=oa.SandboxSpec(), close_agent=close_agent)


# -- create concurrency: one owner ----------------------------------------------------------------


class GatedSim(SimAdapter):
    """A sim adapter that declares its own bound on creates in flight in its facts, as docker
    and kubernetes do (their ``max_creating`` option), and records the most it saw at once."""

    def __init__(self, max_creating: int):
        super().__init__(SimConfig(create_latency=Latency.parse("const:0.02")))
        self.facts = AdapterFacts(runs_commands=False, max_creating=max_creating)
        self.in_flight = self.peak = 0

    async def create(self, spec: oa.SandboxSpec):  # type: ignore[override]
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await super().create(spec)
        finally:
            self.in_flight -= 1


async def test_the_pool_reads_create_concurrency_from_the_adapter() -> None:
    from orchard_async.engine.pool import DEFAULT_MAX_CREATING

    adapter = GatedSim(max_creating=3)
    assert oa.Pool(adapter).max_creating == 3 and oa.Pool(SimAdapter()).max_creating == DEFAULT_MAX_CREATING
    assert oa.Pool(adapter, max_creating=2).max_creating == 2  # a caller's own cap for its pool
    results = await drain(tasks(), StepsPolicy(), adapter, n=24, concurrency=24)  # drain's pool reads the bound
    assert_accounted(results, 24)
    assert adapter.peak == 3  # the pool (the only gate: GatedSim gates nothing) held the adapter's bound
    with pytest.raises(oa.ConfigError, match="max_creating"):
        oa.Pool(adapter, max_creating=0)


def test_graded_apart_answers_as_isinstance_does() -> None:
    """The engine's GradedApart check (3.11's isinstance on a Protocol is slow) gives
    isinstance's answer for every shape a task comes in."""
    from types import SimpleNamespace

    from orchard_async.engine.plan import graded_apart
    from orchard_async.protocols import GradedApart

    async def method(*_: object) -> None:
        return None

    class Apart:
        submission = grade = method

    class Registered:
        pass

    GradedApart.register(Registered)
    shaded = Apart()
    shaded.grade = None  # type: ignore[method-assign]  # its class still is one
    shapes = [
        Apart(),
        shaded,
        Registered(),
        SimpleNamespace(submission=method, grade=method),
        SimpleNamespace(submission=method, grade=None),
        SimpleNamespace(submission=method),
        SimpleNamespace(),
        object(),
    ]
    answers = [graded_apart(shape) for shape in shapes]
    assert answers == [isinstance(shape, GradedApart) for shape in shapes]
    assert answers[0] and not answers[-1] and answers != [answers[0]] * len(answers)

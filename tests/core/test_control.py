"""A trainer's mid-run controls (orchard_async.engine.control): abort (sandboxes closed within a
second, ``aborted`` never data), progressive groups (grown samples of a forked group start from
the same snapshot), pause at a turn boundary across a weight sync (sandbox kept, deadline and
TTL extended, each step tagged with its weight version)."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

import orchard_async as oa
from orchard_async.adapters.local import LocalAdapter
from orchard_async.adapters.sim import SimAdapter, SimConfig
from orchard_async.capabilities import ExtendableTTL, TTLCapExceeded
from orchard_async.engine import control as control_module
from orchard_async.engine.control import RolloutControl
from orchard_async.engine.plan import TTL_MARGIN
from orchard_async.records.export import rl_records, sft_records


@dataclass(eq=False)
class SleepTask:
    """Its policy runs a long command: the episode is busy in its sandbox when aborted."""

    id: str = "sleepy"
    spec: oa.SandboxSpec = field(default_factory=oa.SandboxSpec)
    max_steps: int = 3
    deadline: float = 120.0
    score_timeout: float = 10.0
    exec_timeout: float = 60.0
    fork_after_setup: bool = False

    async def setup(self, sandbox: oa.Sandbox) -> str:
        return "sleep"

    async def evaluate(self, sandbox: oa.Sandbox) -> oa.Reward:
        return oa.Reward(value=1.0, success=True)


class SleepPolicy:
    name = "sleep"

    async def act(self, observation: oa.Observation) -> oa.Action:
        return oa.Action(command="sleep 60")


class Counting:
    """The adapter, counting the sandboxes it has open and keeping every spec it was asked for."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name = inner.name
        self.open = 0
        self.specs: list[oa.SandboxSpec] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def create(self, spec: oa.SandboxSpec) -> Any:
        sandbox = await self.inner.create(spec)
        self.specs.append(spec)
        self.open += 1
        counter = self

        class Closing:
            def __getattr__(self, name: str) -> Any:
                return getattr(sandbox, name)

            async def close(self) -> None:
                try:
                    await sandbox.close()
                finally:
                    counter.open -= 1

        return Closing()


async def wait_for(condition: Any, timeout: float = 30.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():  # noqa: ASYNC110 - polls counters of the adapter and the control
            await anyio.sleep(0.01)


async def abort_storm(tmp_path: Path, episodes: int) -> None:
    """``episodes`` episodes in flight on local, each in a long command, aborted at once: every
    sandbox closed within 5 s, every trajectory ``aborted``, none exported."""
    async with LocalAdapter(root=tmp_path) as local:
        adapter = Counting(local)
        control = RolloutControl()
        results: list[oa.Trajectory] = []
        stream = oa.rollout([SleepTask()], SleepPolicy(), adapter, n=episodes, concurrency=episodes, control=control)
        async with contextlib.aclosing(stream), anyio.create_task_group() as group:

            async def consume() -> None:
                async for trajectory in stream:
                    results.append(trajectory)

            group.start_soon(consume)
            await wait_for(lambda: adapter.open == episodes and len(control.running) == episodes, timeout=120)
            await anyio.sleep(0.2)  # the commands are under way
            started = time.monotonic()
            assert control.abort_all() == episodes
            await wait_for(lambda: adapter.open == 0, timeout=5)
            closed_in = time.monotonic() - started
            await wait_for(lambda: len(results) == episodes, timeout=5)
        assert closed_in < 5, closed_in
        assert Counter(t.end_reason for t in results) == {oa.EndReason.ABORTED: episodes}
        assert all(t.status == "failed" and not t.steps and not t.retries for t in results)
        # Never data: every export leaves them out and counts them, the summary judges none.
        rl = rl_records(results, lambda t: [])
        assert not rl.records and rl.skipped == {"aborted": episodes}
        skipped: Counter[str] = Counter()
        assert sft_records(results, lambda t: [], skipped=skipped) == [] and skipped == {"aborted": episodes}
        summary = oa.summarize(results)
        assert summary.judged == 0 and summary.mean_reward is None and summary.exit_reasons == {"aborted": episodes}
        assert oa.EndReason.ABORTED.is_infra and not oa.EndReason.ABORTED.scored


async def test_an_aborted_episode_closes_its_sandbox_within_a_second(tmp_path: Path) -> None:
    async with LocalAdapter(root=tmp_path) as local:
        adapter = Counting(local)
        control = RolloutControl()
        results: list[oa.Trajectory] = []
        stream = oa.rollout([SleepTask()], SleepPolicy(), adapter, n=3, concurrency=2, control=control)
        async with contextlib.aclosing(stream), anyio.create_task_group() as group:

            async def consume() -> None:
                async for trajectory in stream:
                    results.append(trajectory)

            group.start_soon(consume)
            await wait_for(lambda: adapter.open == 2 and len(control.running) == 2)
            first = sorted(control.running)[0]
            assert control.abort("sleepy/g2/s0")  # planned, not started: aborted without a sandbox
            assert not control.abort("no/such/episode")
            started = time.monotonic()
            assert control.abort(first)
            await wait_for(lambda: adapter.open == 1, timeout=1)
            assert time.monotonic() - started < 1
            await wait_for(lambda: any(t.episode_id == first for t in results))
            assert all(t.end_reason == oa.EndReason.ABORTED for t in results)
            control.abort_all()
            await wait_for(lambda: len(results) == 3, timeout=5)
        assert adapter.open == 0 and len(adapter.specs) == 2, "the unstarted episode must never get a sandbox"
        assert {t.end_reason for t in results} == {oa.EndReason.ABORTED}


async def test_abort_storm_of_8(tmp_path: Path) -> None:
    await abort_storm(tmp_path, 8)


@pytest.mark.soak
async def test_abort_storm_of_256(tmp_path: Path) -> None:
    await abort_storm(tmp_path, 256)


# -- progressive groups ----------------------------------------------------------------------


@dataclass(eq=False)
class ForkedTask:
    """Set up once per group (its setup counts itself); every sample submits at once."""

    id: str = "forked"
    spec: oa.SandboxSpec = field(default_factory=oa.SandboxSpec)
    max_steps: int = 2
    deadline: float = 60.0
    score_timeout: float = 10.0
    exec_timeout: float = 10.0
    fork_after_setup: bool = True
    setups: int = 0

    async def setup(self, sandbox: oa.Sandbox) -> str:
        self.setups += 1
        assert (await sandbox.exec("echo ready > flag")).ok
        return "go"

    async def evaluate(self, sandbox: oa.Sandbox) -> oa.Reward:
        ready = (await sandbox.exec("cat flag")).stdout.decode().strip() == "ready"
        return oa.Reward(value=float(ready), success=ready)


class SubmitPolicy:
    name = "submit"

    async def act(self, observation: oa.Observation) -> oa.Action:
        return oa.Action(kind="submit")


async def test_a_group_grows_after_its_first_rewards_from_the_same_snapshot(tmp_path: Path) -> None:
    task = ForkedTask()
    async with LocalAdapter(root=tmp_path) as adapter:
        control = RolloutControl(hold=True)
        results: list[oa.Trajectory] = []
        grown: list[str] = []
        stream = oa.rollout([task], SubmitPolicy(), adapter, n=2, group_size=2, concurrency=4, control=control)
        async with contextlib.aclosing(stream):
            async for trajectory in stream:
                results.append(trajectory)
                if len(results) == 2:  # the group's first rewards: ask for more samples of it
                    grown = control.grow(trajectory.group_id, 3)
                if len(results) == 5:
                    control.close()
        assert grown == ["forked/g0/s2", "forked/g0/s3", "forked/g0/s4"]
        assert sorted(t.sample for t in results) == [0, 1, 2, 3, 4]
        assert all(t.success for t in results), [t.error for t in results]
        assert task.setups == 1, "the grown samples must start from the group's snapshot, not set up again"
        snapshots = {t.forked_from for t in results}
        assert len(snapshots) == 1 and snapshots != {""}
        assert not await adapter.list_owned(), "the snapshot and every sandbox are gone when the rollout ends"
        with pytest.raises(oa.ConfigError, match="ended or was closed"):
            control.grow("forked/g0", 1)


async def test_growth_without_hold_and_bad_requests_are_refused() -> None:
    adapter = SimAdapter(SimConfig())
    control = RolloutControl()
    async with contextlib.aclosing(
        oa.rollout([SleepTask(max_steps=1)], SubmitPolicy(), adapter, n=2, control=control)
    ) as s:
        results = [t async for t in s]
    assert len(results) == 2
    with pytest.raises(oa.ConfigError, match="hold=True"):
        control.grow(results[0].group_id, 1)
    with pytest.raises(oa.ConfigError, match="one rollout"):
        control.attach([])
    other = RolloutControl(hold=True)
    other.attach(oa.plan([SleepTask()], 2, 2))
    with pytest.raises(oa.ConfigError, match="no group"):
        other.grow("nope", 1)
    with pytest.raises(oa.ConfigError, match="at least 1"):
        other.grow("sleepy/g0", 0)
    with pytest.raises(oa.ConfigError, match="pause_allowance"):
        RolloutControl(pause_allowance=-1)
    for bad in (-1, float("inf")):
        with pytest.raises(oa.ConfigError, match="max_pause"):
            RolloutControl(max_pause=bad)
        with pytest.raises(oa.ConfigError, match="max_extension"):
            oa.SandboxSpec(max_extension=bad)


# -- pause across a weight sync --------------------------------------------------------------


@dataclass(eq=False)
class StepsTask:
    id: str = "steps"
    spec: oa.SandboxSpec = field(default_factory=oa.SandboxSpec)
    max_steps: int = 10
    deadline: float = 1.0
    score_timeout: float = 0.2
    exec_timeout: float = 1.0
    fork_after_setup: bool = False

    async def setup(self, sandbox: oa.Sandbox) -> str:
        return "count"

    async def evaluate(self, sandbox: oa.Sandbox) -> oa.Reward:
        return oa.Reward(value=1.0, success=True)


class SlowSteps:
    """Six commands, each turn's model call taking 20 ms; counts its calls."""

    name = "slow"

    def __init__(self) -> None:
        self.calls = 0

    async def act(self, observation: oa.Observation) -> oa.Action:
        self.calls += 1
        await anyio.sleep(0.02)
        return oa.Action(command="true") if observation.step < 6 else oa.Action(kind="submit")


async def test_pause_holds_every_episode_at_a_turn_boundary_across_a_weight_sync() -> None:
    adapter = Counting(SimAdapter(SimConfig()))
    policy = SlowSteps()
    control = RolloutControl(weight_version="v0", pause_allowance=30)
    results: list[oa.Trajectory] = []
    stream = oa.rollout([StepsTask()], policy, adapter, n=4, concurrency=4, control=control)
    async with contextlib.aclosing(stream), anyio.create_task_group() as group:

        async def consume() -> None:
            async for trajectory in stream:
                results.append(trajectory)

        group.start_soon(consume)
        await wait_for(lambda: policy.calls >= 8)
        await control.pause()
        assert control.paused and len(control.running) == 4
        calls = policy.calls
        await anyio.sleep(1.2)  # longer than the task's whole deadline: a pause does not count against it
        assert policy.calls == calls, "a paused episode must not call its policy"
        assert adapter.open == 4, "a paused episode keeps its sandbox"
        control.resume(weight_version="v1")
        await wait_for(lambda: len(results) == 4)
    for t in results:
        assert t.end_reason == oa.EndReason.SUBMITTED and not t.retries, (t.end_reason, t.error)
        versions = [step.weight_version for step in t.steps]
        assert versions == sorted(versions) and set(versions) == {"v0", "v1"}, versions
        assert [op.name for op in t.ops].count("create") == 1, "the same sandbox before and after the pause"
    # The TTL is sized for the pause allowance on top of the deadline and its margin.
    assert all(spec.ttl == StepsTask().deadline + TTL_MARGIN + 30 for spec in adapter.specs)


class NotExtendable:
    """The sim adapter, its sandboxes without ``extend_ttl`` (as an adapter that cannot)."""

    def __init__(self) -> None:
        self.inner = SimAdapter(SimConfig())
        self.name = "sim"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def create(self, spec: oa.SandboxSpec) -> Any:
        sandbox = await self.inner.create(spec)

        class Plain:
            def __getattr__(self, name: str) -> Any:
                if name == "extend_ttl":
                    raise AttributeError(name)
                return getattr(sandbox, name)

        return Plain()


async def paused_rollout(adapter: Any, control: RolloutControl, pause: float) -> list[oa.Trajectory]:
    """Two episodes of StepsTask, paused for ``pause`` seconds after their first turns."""
    policy = SlowSteps()
    results: list[oa.Trajectory] = []
    stream = oa.rollout([StepsTask(deadline=30)], policy, adapter, n=2, control=control)
    async with contextlib.aclosing(stream), anyio.create_task_group() as group:

        async def consume() -> None:
            async for trajectory in stream:
                results.append(trajectory)

        group.start_soon(consume)
        await wait_for(lambda: policy.calls >= 2)
        await control.pause()
        await anyio.sleep(pause)
        control.resume("v1")
        await wait_for(lambda: len(results) == 2)
    return results


async def test_a_pause_longer_than_the_allowance_aborts_at_resume_where_the_ttl_cannot_be_extended() -> None:
    control = RolloutControl(weight_version="v0", pause_allowance=0.1)
    results = await paused_rollout(NotExtendable(), control, 0.3)
    assert [t.end_reason for t in results] == [oa.EndReason.ABORTED] * 2
    assert not any(op.name == "extend" for t in results for op in t.ops)


async def test_a_pause_longer_than_the_allowance_resumes_on_an_extendable_sandbox(monkeypatch) -> None:
    monkeypatch.setattr(control_module, "EXTEND_EVERY", 0.1)  # extended while paused, not only at resume
    adapter = Counting(SimAdapter(SimConfig()))
    control = RolloutControl(weight_version="v0", pause_allowance=0.1, max_pause=60)
    results = await paused_rollout(adapter, control, 0.35)
    assert all(spec.max_extension == 60 for spec in adapter.specs)
    for t in results:
        assert t.end_reason == oa.EndReason.SUBMITTED, (t.end_reason, t.error)
        assert {step.weight_version for step in t.steps} == {"v0", "v1"}
        extends = [op for op in t.ops if op.name == "extend"]
        assert len(extends) >= 3, extends  # ~3 while paused, one at resume
        extended = sum(float(op.outcome.strip("+s")) for op in extends)
        assert 0.35 <= extended < 1.0, extends


async def test_a_pause_past_the_extension_cap_falls_back_to_the_allowance() -> None:
    # The cap refuses the extension; the allowance (0.6 s) still covers the 0.3 s pause.
    control = RolloutControl(weight_version="v0", pause_allowance=0.6, max_pause=0.1)
    results = await paused_rollout(SimAdapter(SimConfig()), control, 0.3)
    for t in results:
        assert t.end_reason == oa.EndReason.SUBMITTED, (t.end_reason, t.error)
        assert [op.outcome for op in t.ops if op.name == "extend"] == ["TTLCapExceeded"]
    # Past both, it aborts.
    control = RolloutControl(weight_version="v0", pause_allowance=0.1, max_pause=0.1)
    results = await paused_rollout(SimAdapter(SimConfig()), control, 0.3)
    assert [t.end_reason for t in results] == [oa.EndReason.ABORTED] * 2


async def test_a_sim_sandbox_extends_its_ttl_within_its_cap() -> None:
    async with SimAdapter(SimConfig()) as adapter:
        box = await adapter.create(oa.SandboxSpec(ttl=5, max_extension=10))
        assert isinstance(box, ExtendableTTL)
        first = await box.extend_ttl(4)
        assert abs(first - (time.time() + 9)) < 0.5
        assert await box.extend_ttl(6) == pytest.approx(first + 6, abs=0.05)
        with pytest.raises(TTLCapExceeded, match="max_extension=10"):
            await box.extend_ttl(0.5)
        for bad in (0, -1, float("inf"), float("nan")):
            with pytest.raises(oa.ConfigError, match="positive, finite"):
                await box.extend_ttl(bad)
        await box.close()
        with pytest.raises(oa.SandboxLost):
            await box.extend_ttl(1)

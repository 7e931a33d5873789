"""Rollout groups set up once and forked (orchard_async.engine.groups), on the local adapter:
setup runs once per group, every sample starts from the set-up state and none sees
another's, the snapshot goes when the group ends (or the run is cancelled), an infra
failure while making the base is retried, and an adapter without snapshots runs the
plain path."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import orchard_async as oa
from orchard_async.adapters.local import LocalAdapter
from orchard_async.errors import CreateFailed

GROUP = 4


@dataclass(eq=False)
class SetUpOnceTask:
    """Its setup leaves a tree and counts how often it ran; evaluate passes when the sample's
    sandbox has that tree and only the sample's own mark (no other sample's)."""

    id: str = "forked"
    spec: oa.SandboxSpec = field(default_factory=oa.SandboxSpec)
    max_steps: int = 3
    deadline: float = 120.0
    score_timeout: float = 20.0
    exec_timeout: float = 30.0
    fork_after_setup: bool = True
    setups: int = 0

    async def setup(self, sandbox: oa.Sandbox) -> str:
        self.setups += 1
        result = await sandbox.exec("mkdir -p state/deep && echo ready > state/deep/flag && echo $$ > state/setup-pid")
        assert result.ok, result.error_text
        return f"work in {sandbox.workdir}"

    async def evaluate(self, sandbox: oa.Sandbox) -> oa.Reward:
        seen = (await sandbox.exec("cat state/deep/flag; ls marks")).stdout.decode().split()
        return oa.Reward(value=1.0, success=seen[0] == "ready" and len(seen) == 2, info={"seen": seen})


class MarkPolicy:
    """Leaves one mark per episode in the sandbox, then submits."""

    name = "mark"

    async def act(self, observation: oa.Observation) -> oa.Action:
        if observation.step == 0:
            mark = observation.episode_id.replace("/", "-")
            return oa.Action(command=f"test -f state/deep/flag && mkdir -p marks && touch marks/{mark} && pwd")
        return oa.Action(kind="submit")


class Wrapped:
    """An adapter passed through, but for what a test overrides."""

    def __init__(self, inner: LocalAdapter):
        self.inner = inner
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def __aenter__(self) -> Wrapped:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.close()


class NoSnapshots(Wrapped):
    def __getattr__(self, name: str) -> Any:
        if name in ("snapshot", "drop_snapshot"):
            raise AttributeError(name)
        return getattr(self.inner, name)


class FlakySnapshots(Wrapped):
    """The first snapshot fails as the backend would (an InfraError)."""

    failed = False

    async def snapshot(self, sandbox: oa.Sandbox) -> str:
        if not self.failed:
            self.failed = True
            raise CreateFailed("injected: the snapshot could not be written")
        return await self.inner.snapshot(sandbox)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


def snapshots_left(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("snap-")) if root.exists() else []


async def drain(task: SetUpOnceTask, adapter: Any, n: int = GROUP) -> list[oa.Trajectory]:
    stream = oa.rollout(
        [task], MarkPolicy(), oa.Pool(adapter, max_backoff=0.05), n=n, group_size=GROUP, retry_backoff=0.01
    )
    async with contextlib.aclosing(stream):
        return [t async for t in stream]


@pytest.mark.parametrize("isolation", ["auto", "none"])
async def test_a_group_is_set_up_once_and_every_sample_starts_from_it(root: Path, isolation: str) -> None:
    task = SetUpOnceTask()
    async with LocalAdapter(root=root, isolation=isolation) as adapter:
        results = await drain(task, adapter)
    assert task.setups == 1
    assert len(results) == GROUP and all(t.status == "finished" for t in results), [t.error for t in results]
    assert all(t.success for t in results), [t.info for t in results]
    snapshots = {t.forked_from for t in results}
    assert len(snapshots) == 1 and snapshots != {""}
    # The shared setup is recorded once, by the sample that made the base; each instruction
    # names the sample's own work dir, which its commands ran in: /workspace for every sandbox
    # with a mount namespace, a host dir of its own without one (the base's path replaced).
    assert sorted(t.timings["setup"] > 0 for t in results) == [False] * (GROUP - 1) + [True]
    for t in results:
        assert t.instruction == f"work in {t.steps[0].observation.strip()}"
    workdirs = {t.instruction for t in results}
    assert workdirs == {"work in /workspace"} if adapter.namespaces else len(workdirs) == GROUP
    assert snapshots_left(root) == []


async def test_each_group_has_its_snapshot_dropped_when_its_last_sample_ends(root: Path) -> None:
    task = SetUpOnceTask()
    results = []
    async with LocalAdapter(root=root) as adapter:
        stream = oa.rollout([task], MarkPolicy(), adapter, n=2 * GROUP, group_size=GROUP, concurrency=1)
        async with contextlib.aclosing(stream):
            async for t in stream:
                results.append(t)
                # Dropped as the group's last sample ends, not at the end of the run.
                assert (t.forked_from in snapshots_left(root)) == (t.sample < GROUP - 1)
    assert task.setups == 2 and all(t.success for t in results)
    by_group: dict[str, set[str]] = {}
    for t in results:
        by_group.setdefault(t.group_id, set()).add(t.forked_from)
    assert len(by_group) == 2 and all(len(s) == 1 for s in by_group.values())
    assert len(set.union(*by_group.values())) == 2
    assert snapshots_left(root) == []


async def test_an_adapter_without_snapshots_runs_the_plain_path(root: Path) -> None:
    task = SetUpOnceTask()
    async with LocalAdapter(root=root) as inner:
        results = await drain(task, NoSnapshots(inner))
    assert task.setups == GROUP and all(t.success and not t.forked_from for t in results)


async def test_a_failed_snapshot_is_retried_like_any_infra_failure(root: Path) -> None:
    task = SetUpOnceTask()
    async with LocalAdapter(root=root) as inner:
        results = await drain(task, FlakySnapshots(inner))
    assert task.setups == 2  # the failed base's, then the retry's
    assert all(t.success and t.forked_from for t in results)
    assert [r.reason for t in results for r in t.retries] == ["create_failed"]
    assert snapshots_left(root) == []


async def test_a_cancelled_run_drops_its_snapshot(root: Path) -> None:
    task = SetUpOnceTask()
    async with LocalAdapter(root=root) as adapter:
        stream = oa.rollout([task], MarkPolicy(), adapter, n=2 * GROUP, group_size=GROUP, concurrency=1)
        async with contextlib.aclosing(stream):
            async for first in stream:
                assert first.forked_from and snapshots_left(root) == [first.forked_from]
                break
        assert snapshots_left(root) == []
        assert await adapter.list_owned() == []


def test_forked_groups_first_samples_go_ahead_of_the_groups_before() -> None:
    from orchard_async.engine.plan import leaders_ahead, plan

    plain = SetUpOnceTask(id="plain", fork_after_setup=False)
    tasks = [SetUpOnceTask(id="a"), plain, SetUpOnceTask(id="b"), SetUpOnceTask(id="c")]
    episodes = plan(tasks, n=12, group_size=3)
    adapter = LocalAdapter(root="/nonexistent")
    order = [e.episode_id for e in leaders_ahead(adapter, episodes, concurrency=1)]  # 2 groups ahead
    assert order == [
        *["a/g0/s0", "plain/g1/s0", "plain/g1/s1", "plain/g1/s2", "b/g2/s0", "c/g3/s0"],
        *["a/g0/s1", "a/g0/s2", "b/g2/s1", "b/g2/s2", "c/g3/s1", "c/g3/s2"],
    ]
    order = [e.episode_id for e in leaders_ahead(adapter, plan(tasks[:1], n=12, group_size=3), concurrency=3)]
    assert order == [
        *["a/g0/s0", "a/g1/s0", "a/g2/s0", "a/g0/s1", "a/g0/s2", "a/g3/s0"],
        *["a/g1/s1", "a/g1/s2", "a/g2/s1", "a/g2/s2", "a/g3/s1", "a/g3/s2"],
    ]
    assert sorted(order) == sorted(e.episode_id for e in plan(tasks[:1], n=12, group_size=3))
    assert leaders_ahead(NoSnapshots(adapter), episodes, concurrency=3) == episodes

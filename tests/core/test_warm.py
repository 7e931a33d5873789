"""Warm pools (orchard_async.engine.warm): pre-created sandboxes handed out by acquire, replenished,
checked, aged by their TTL, and all gone after close or cancellation."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async.adapters.local import LocalAdapter, _sandbox_processes
from orchard_async.adapters.sim import Latency, SimAdapter, SimConfig
from orchard_async.engine.plan import WarmAhead
from orchard_async.kit import labels as names
from tests.conftest import backend_missing, cluster_configured, docker_unready
from tests.core.test_rollout import CountTask, StepsPolicy, tasks

SPEC = oa.SandboxSpec(labels={"orchard.recipe": "warmtest"})


def episode_spec(episode: str, attempt: int = 0) -> oa.SandboxSpec:
    return oa.SandboxSpec(labels={**SPEC.labels, names.EPISODE: episode, names.ATTEMPT: str(attempt)})


async def until(condition, what: str, limit: float = 30.0) -> None:
    with anyio.fail_after(limit):
        while not condition():  # noqa: ASYNC110 - polls state the test watches from outside
            await anyio.sleep(0.01)


def sim(create_latency: float = 0.0) -> SimAdapter:
    return SimAdapter(SimConfig(create_latency=Latency("const", create_latency)))


async def test_acquire_hands_out_a_precreated_sandbox_and_replenishes() -> None:
    adapter = sim()
    async with oa.Pool(adapter) as pool:
        pool.warm(SPEC, 2)
        await until(lambda: pool.warm_stats["ready"] == 2, "two warm sandboxes")
        precreated = set(adapter.live)
        assert adapter.created == 2
        sandbox = await pool.acquire(episode_spec("t/g0/s0"))
        assert sandbox.id in precreated  # handed over, not created for this acquire
        # The episode's labels are on the sandbox object handed out; its shelf's are kept.
        assert sandbox.labels[names.EPISODE] == "t/g0/s0" and sandbox.labels["orchard.recipe"] == "warmtest"
        await until(lambda: pool.warm_stats["ready"] == 2, "the replacement")
        assert adapter.created == 3
        assert pool.warm_stats["hits"] == 1
        await pool.close_sandbox(sandbox)
    assert adapter.live == {}


async def test_a_spec_without_a_shelf_is_created_as_before() -> None:
    adapter = sim()
    async with oa.Pool(adapter) as pool:
        pool.warm(SPEC, 1)
        await until(lambda: pool.warm_stats["ready"] == 1, "a warm sandbox")
        other = await pool.acquire(oa.SandboxSpec(labels={"orchard.recipe": "other"}))
        assert other.labels == {"orchard.recipe": "other"} and adapter.created == 2
        assert pool.warm_stats["misses"] == 0 and pool.warm_stats["ready"] == 1
        await pool.close_sandbox(other)


async def test_an_acquire_takes_over_a_create_under_way() -> None:
    adapter = sim(create_latency=0.2)
    async with oa.Pool(adapter) as pool:
        pool.warm(SPEC, 1)
        await until(lambda: adapter.creates == 1, "the warm create to start")
        sandbox = await pool.acquire(episode_spec("t/g0/s0"))
        # Its create was the warm one; the only other create is the replacement.
        assert pool.warm_stats["claimed"] == 1 and pool.warm_stats["misses"] == 0
        await until(lambda: pool.warm_stats["ready"] == 1, "the replacement")
        assert adapter.creates == 2
        await pool.close_sandbox(sandbox)


class GatedSim(SimAdapter):
    """Its creates wait until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = anyio.Event()

    async def create(self, spec: oa.SandboxSpec):  # type: ignore[override]
        self.creates += 1
        await self.gate.wait()
        self.creates -= 1  # counted again by the sim's own create
        return await super().create(spec)


async def test_no_create_for_stock_starts_while_an_acquire_waits_for_one() -> None:
    adapter = GatedSim()
    async with oa.Pool(adapter) as pool:
        pool.warm(SPEC, 2)
        await until(lambda: adapter.creates == 2, "two warm creates to start")
        got: list[oa.Sandbox] = []
        async with anyio.create_task_group() as group:
            for index in range(3):  # two take over the warm creates, the third makes its own
                group.start_soon(lambda i=index: _acquire_into(pool, got, i))
            await until(lambda: pool._warm.demand == 3, "three acquires waiting")
            assert adapter.creates == 3  # the replacements of the two taken over wait for them
            adapter.gate.set()
        assert pool.warm_stats["claimed"] == 2 and pool.warm_stats["misses"] == 1
        await until(lambda: pool.warm_stats["ready"] == 2, "the stock made once nobody waits")
        assert adapter.creates == 5
        for sandbox in got:
            await pool.close_sandbox(sandbox)


async def _acquire_into(pool: oa.Pool, got: list[oa.Sandbox], index: int) -> None:
    got.append(await pool.acquire(episode_spec(f"t/g0/s{index}")))


async def test_a_sandbox_that_died_while_warm_is_never_handed_out() -> None:
    adapter = sim()
    async with oa.Pool(adapter) as pool:
        pool.warm(SPEC, 3)
        await until(lambda: pool.warm_stats["ready"] == 3, "three warm sandboxes")
        pool.warm(SPEC, 0)  # no replacements: the acquire must create its own
        dead = set(adapter.live)
        for sandbox in adapter.live.values():
            sandbox.dead = True
        sandbox = await pool.acquire(episode_spec("t/g0/s0"))
        assert sandbox.id not in dead
        assert (await sandbox.exec("true")).ok
        assert pool.warm_stats["dead"] == 3
        await until(lambda: not dead & set(adapter.live), "the dead ones closed")
        await pool.close_sandbox(sandbox)


async def test_a_killed_local_sandbox_is_never_handed_out(tmp_path: Path) -> None:
    async with LocalAdapter(root=tmp_path / "sbx") as adapter, oa.Pool(adapter) as pool:
        pool.warm(SPEC, 2)
        await until(lambda: pool.warm_stats["ready"] == 2, "two warm sandboxes")
        victim = next(iter(adapter._live))
        where = str(tmp_path / "sbx" / victim)
        os.killpg(adapter._live[victim][1].pid, signal.SIGKILL)  # its launcher, then all that runs in it
        for pid in _sandbox_processes().get(where, []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await until(lambda: where not in _sandbox_processes(), "the killed sandbox's processes to be gone")
        handed = [await pool.acquire(episode_spec(f"t/g0/s{i}")) for i in range(2)]
        assert victim not in {sandbox.id for sandbox in handed}
        for sandbox in handed:
            assert (await sandbox.exec("echo alive")).text == "alive\n"
            await pool.close_sandbox(sandbox)
        assert pool.warm_stats["dead"] == 1


async def test_a_warm_sandbox_past_its_idle_time_is_not_handed_out() -> None:
    adapter = sim()
    async with oa.Pool(adapter, warm_max_idle=0.3) as pool:
        pool.warm(SPEC, 1)
        await until(lambda: pool.warm_stats["ready"] == 1, "a warm sandbox")
        (old,) = adapter.live
        # Its TTL was counted from its create: it got the spec's TTL plus the idle time.
        assert adapter.live[old].expires_at - time.monotonic() > SPEC.ttl
        pool.warm(SPEC, 0)
        await anyio.sleep(0.4)
        sandbox = await pool.acquire(episode_spec("t/g0/s0"))
        assert sandbox.id != old
        assert pool.warm_stats["expired"] == 1 and old not in adapter.live
        await pool.close_sandbox(sandbox)


async def test_closing_the_pool_closes_the_warm_sandboxes(tmp_path: Path) -> None:
    root = tmp_path / "sbx"
    async with LocalAdapter(root=root) as adapter:
        pool = oa.Pool(adapter)
        pool.warm(SPEC, 3)
        await until(lambda: pool.warm_stats["ready"] == 3, "three warm sandboxes")
        assert len(await adapter.list_owned()) == 3
        await pool.close()
        assert await adapter.list_owned() == []
        assert not root.exists() or list(root.iterdir()) == []


async def test_cancelling_while_replenishing_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "sbx"
    async with LocalAdapter(root=root) as adapter:
        pool = oa.Pool(adapter)
        pool.warm(SPEC, 4)
        await until(lambda: root.exists() and any(root.iterdir()), "the creates to be under way")
        await pool.close()  # cancels the creates midway
        assert await adapter.list_owned() == []
        assert list(root.iterdir()) == []
        assert pool.warm_stats["ready"] == 0


async def test_rollout_keeps_the_next_episodes_warm_without_waste() -> None:
    adapter = sim(create_latency=0.02)
    pool = oa.Pool(adapter)
    async with contextlib.aclosing(
        oa.rollout(tasks(2, steps=2), StepsPolicy(), pool, n=16, concurrency=4, warm=4)
    ) as stream:
        results = [t async for t in stream]
    assert len(results) == 16 and all(t.status == "finished" for t in results)
    stats = pool.warm_stats
    # The keys the engine warms are the specs the episode loop asks for: its acquires find
    # them. (An acquire that comes while others wait for creates, when no create for stock
    # starts, makes its own: a miss.)
    assert stats["hits"] + stats["claimed"] + stats["misses"] == 16 and stats["hits"] + stats["claimed"] >= 4, stats
    assert adapter.created <= 16 + 4  # at most the last window's stock made for nobody
    assert adapter.live == {}


async def test_cancelling_a_warm_rollout_leaves_nothing() -> None:
    adapter = sim(create_latency=0.05)
    pool = oa.Pool(adapter)
    async with contextlib.aclosing(
        oa.rollout(tasks(4, steps=2), StepsPolicy(), pool, n=40, concurrency=4, warm=8)
    ) as stream:
        async for _ in stream:
            break  # the consumer stops with creates under way
    assert adapter.live == {}
    assert pool.warm_stats["ready"] == 0


async def test_warm_is_off_by_default_where_it_does_not_pay() -> None:
    adapter = sim()
    pool = oa.Pool(adapter)
    async with contextlib.aclosing(oa.rollout(tasks(2, steps=1), StepsPolicy(), pool, n=4)) as stream:
        assert len([t async for t in stream]) == 4
    assert set(pool.warm_stats.values()) == {0}
    with pytest.raises(oa.ConfigError, match="warm"):
        async with contextlib.aclosing(oa.rollout(tasks(1), StepsPolicy(), pool, n=1, warm=-1)) as stream:
            [t async for t in stream]


async def served_warm_by_default(adapter: oa.Adapter) -> None:
    """A rollout with no ``warm`` given: the engine warms by default on this adapter, serves
    episodes warm, and leaves nothing owned; the adapter is closed after."""
    pool = oa.Pool(adapter)
    try:
        async with contextlib.aclosing(
            oa.rollout(tasks(2, steps=1), StepsPolicy(), pool, n=4, concurrency=2)
        ) as stream:
            results = [t async for t in stream]
        assert [t.status for t in results] == ["finished"] * 4
        stats = pool.warm_stats
        assert stats["hits"] + stats["claimed"] + stats["misses"] == 4 and stats["hits"] + stats["claimed"] >= 2, stats
        assert await adapter.list_owned() == []
    finally:
        await adapter.close()


async def docker_adapter(run_id: str) -> oa.Adapter:
    """A docker adapter with this run id, or the test skips (fails in CI) without a daemon
    or its test image."""
    image = os.environ.get("ORCHARD_DOCKER_TEST_IMAGE", "orchard/busybox:test")
    if reason := await docker_unready(image):
        backend_missing(reason)
    from orchard_async.adapters.docker import DockerAdapter

    return DockerAdapter(image=image, run_id=run_id)


async def test_a_docker_rollout_is_warm_by_default_and_leaves_nothing() -> None:
    run_id = f"t{uuid.uuid4().hex[:10]}"
    adapter = await docker_adapter(run_id)
    await served_warm_by_default(adapter)
    listed = await anyio.run_process(["docker", "ps", "-aq", "--filter", f"label=orchard.run={run_id}"])
    assert listed.stdout.strip() == b""


async def test_a_docker_sandbox_killed_behind_the_pools_back_is_never_handed_out() -> None:
    """`docker kill` on a warm sandbox, then at once the acquires: the check (its shell must
    answer) finds it dead, closes it and hands out live ones only."""
    run_id = f"t{uuid.uuid4().hex[:10]}"
    adapter = await docker_adapter(run_id)
    try:
        async with oa.Pool(adapter) as pool:
            pool.warm(SPEC, 2)
            await until(lambda: pool.warm_stats["ready"] == 2, "two warm sandboxes", limit=120)
            pool.warm(SPEC, 0)  # no replacements: what is handed out is what was warm, or a create
            victim = (await adapter.list_owned())[0]
            await anyio.run_process(["docker", "kill", victim])
            handed = [await pool.acquire(episode_spec(f"t/g0/s{i}")) for i in range(2)]
            assert victim not in {sandbox.id for sandbox in handed}
            for sandbox in handed:
                assert (await sandbox.exec("echo alive")).text == "alive\n"
                await pool.close_sandbox(sandbox)
            assert pool.warm_stats["dead"] == 1 and pool.warm_stats["hits"] == 1
        assert await adapter.list_owned() == []
    finally:
        await adapter.close()
    listed = await anyio.run_process(["docker", "ps", "-aq", "--filter", f"label=orchard.run={run_id}"])
    assert listed.stdout.strip() == b""


async def test_a_forked_group_warms_its_base_not_its_samples(tmp_path: Path) -> None:
    forking = tasks(2, steps=1)
    for task in forking:
        task.fork_after_setup = True  # type: ignore[attr-defined]
    async with LocalAdapter(root=tmp_path / "sbx") as adapter:
        pool = oa.Pool(adapter)
        episodes = oa.plan(forking, n=8, group_size=4)
        ahead = WarmAhead(pool, episodes, size=8)
        next(iter(ahead))
        # Every sample starts from its group's snapshot; only each group's base is a fresh
        # sandbox (the taken first sample's base, then the other group's: 1 left in the window).
        roles = {shelf.spec.labels.get(names.ROLE): shelf.target for shelf in pool._warm.shelves.values()}
        assert roles == {"group-setup": 1}
        await pool.close()
        async with contextlib.aclosing(oa.rollout(forking, StepsPolicy(), pool, n=8, group_size=4, warm=8)) as stream:
            results = [t async for t in stream]
        assert [t.status for t in results] == ["finished"] * 8 and all(t.forked_from for t in results)
        stats = pool.warm_stats
        assert stats["hits"] + stats["claimed"] + stats["misses"] == 2 and stats["hits"] + stats["claimed"] >= 1
        assert await adapter.list_owned() == []


@dataclass
class GradedCountTask(CountTask):
    """Graded apart: its verdict comes from a scorer sandbox of its own."""

    async def submission(self, sandbox: oa.Sandbox) -> str:
        return (await sandbox.read_file("goal")).decode()

    async def grade(self, submission: str, sandbox: oa.Sandbox) -> oa.Reward:
        return oa.Reward(value=1.0, success=submission == str(self.steps))


async def test_a_graded_apart_task_gets_its_scorer_warm_too() -> None:
    adapter = sim(create_latency=0.02)
    pool = oa.Pool(adapter)
    graded = [GradedCountTask(f"t{i}", steps=2) for i in range(2)]
    async with contextlib.aclosing(oa.rollout(graded, StepsPolicy(), pool, n=8, concurrency=2, warm=2)) as stream:
        results = [t async for t in stream]
    assert [t.success for t in results] == [True] * 8
    stats = pool.warm_stats
    assert stats["hits"] + stats["claimed"] + stats["misses"] == 16, stats  # an agent and a scorer each
    # Both tasks ask for the same spec: one shelf of agents, one of scorers.
    scorer_shelves = [shelf for shelf in pool._warm.shelves.values() if shelf.spec.labels.get(names.ROLE) == "scorer"]
    assert len(scorer_shelves) == 1 and stats["hits"] + stats["claimed"] >= 4, stats
    assert adapter.live == {}


@pytest.mark.soak  # a rollout on the cluster (~10 s); the docker one stays in the default run
async def test_a_kubernetes_rollout_is_warm_by_default_and_leaves_nothing() -> None:
    if not cluster_configured():
        pytest.skip("no Kubernetes cluster configured (KUBECONFIG, ~/.kube/config or ORCHARD_K8S_TEST_CONTEXT)")
    try:
        from orchard_async.adapters.kubernetes import KubernetesAdapter

        adapter = KubernetesAdapter(
            image=os.environ.get("ORCHARD_K8S_TEST_IMAGE", "local/busybox:1"),
            namespace=os.environ.get("ORCHARD_K8S_TEST_NAMESPACE", "orchard-test"),
            context=os.environ.get("ORCHARD_K8S_TEST_CONTEXT"),
        )
        await adapter.doctor()
    except Exception as exc:  # noqa: BLE001 - any reason the cluster cannot be used here
        backend_missing(f"kubernetes: {exc}")
    await served_warm_by_default(adapter)

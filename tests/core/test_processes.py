"""A rollout in worker processes (``ProcessRollout``): the plan split by group, every episode
back exactly once, the workers gone when the caller stops, a worker's failure named."""

from __future__ import annotations

import contextlib

import anyio
import psutil
import pytest

import orchard_async as oa
from orchard_async.engine.processes import share, split
from tests.core.process_workloads import EchoTask

BUILD = "tests.core.process_workloads:echo"


@pytest.fixture
def workers_left():
    """The processes this test started that are still there (those of other tests excepted)."""
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    return lambda: {child.pid for child in psutil.Process().children(recursive=True)} - before


async def drain(run: oa.ProcessRollout) -> list[oa.Trajectory]:
    return [trajectory async for trajectory in run]


def planned(tasks: int, n: int, group_size: int = 1) -> list[oa.Episode]:
    """The plan ``rollout`` makes of the echo build's tasks."""
    return oa.plan([EchoTask(f"echo-{index}") for index in range(tasks)], n, group_size)


def test_the_plan_is_split_by_group_and_the_concurrency_evenly() -> None:
    episodes = planned(5, 20, group_size=4)
    shares = [share(episodes, worker, 3) for worker in range(3)]
    assert sorted(ep.episode_id for part in shares for ep in part) == sorted(ep.episode_id for ep in episodes)
    for part in shares:  # whole groups only
        groups = {ep.group_id for ep in part}
        assert len(part) == 4 * len(groups)
    assert [len(part) for part in shares] == [8, 8, 4]
    assert split(10, 3) == [4, 3, 3] and split(3, 3) == [1, 1, 1]


async def test_every_planned_episode_comes_back_once_from_the_worker_of_its_group(workers_left) -> None:
    run = oa.ProcessRollout(BUILD, {"tasks": 5}, processes=2, concurrency=4, n=20, group_size=2, run_id="r1")
    trajectories = await drain(run)
    ids = [ep.episode_id for ep in planned(5, 20, 2)]
    assert sorted(t.episode_id for t in trajectories) == sorted(ids)
    assert all(t.status == "finished" and t.run_id == "r1" and len(t.steps) == 4 for t in trajectories)
    reports = run.reports
    assert [report["worker"] for report in reports] == [[0, 2], [1, 2]]
    assert reports[0]["pid"] != reports[1]["pid"]
    ran = [set(report["episodes"]) for report in reports]
    assert not ran[0] & ran[1] and ran[0] | ran[1] == set(ids)
    for group in {t.group_id for t in trajectories}:  # a group's samples all in one worker
        members = {t.episode_id for t in trajectories if t.group_id == group}
        assert members <= ran[0] or members <= ran[1]
    assert run.started is not None
    assert workers_left() == set()


async def test_skipped_episodes_are_not_run_again() -> None:
    first = await drain(oa.ProcessRollout(BUILD, {"tasks": 4}, processes=2, concurrency=2, run_id="r2"))
    done = {t.episode_id for t in first[:3]}
    again = await drain(oa.ProcessRollout(BUILD, {"tasks": 4}, processes=2, concurrency=2, skip=done, run_id="r2"))
    assert {t.episode_id for t in again} == {t.episode_id for t in first} - done


async def test_a_caller_that_stops_early_leaves_no_worker_behind(workers_left) -> None:
    run = oa.ProcessRollout(BUILD, {"tasks": 40, "slow": 0.05}, processes=2, concurrency=4)
    async with contextlib.aclosing(run.__aiter__()) as stream:
        async for _ in stream:
            assert len(workers_left()) >= 2  # the workers run while the caller iterates
            break
    assert workers_left() == set()


async def test_a_cancelled_caller_leaves_no_worker_behind(workers_left) -> None:
    run = oa.ProcessRollout(BUILD, {"tasks": 40, "slow": 0.05}, processes=2, concurrency=4)
    with anyio.move_on_after(1.5):
        await drain(run)
    assert workers_left() == set()


async def test_a_worker_that_cannot_build_its_workload_is_named(workers_left) -> None:
    run = oa.ProcessRollout("tests.core.process_workloads:broken", processes=2, concurrency=2)
    with pytest.raises(oa.OrchardError, match="worker 0 could not start: ValueError: no such model server"):
        await drain(run)
    assert workers_left() == set()


async def test_a_worker_that_dies_mid_run_costs_its_own_episodes_only_and_says_how_many(workers_left) -> None:
    run = oa.ProcessRollout(BUILD, {"tasks": 12, "die_after": 2, "die_in": 1}, processes=2, concurrency=2)
    received: list[oa.Trajectory] = []
    with pytest.raises(oa.OrchardError, match=r"worker 1 stopped with \d+ of 6 episodes not returned") as caught:
        async for trajectory in run:
            received.append(trajectory)
    assert "skip" in str(caught.value)
    assert len([t for t in received if t.episode_id.split("/")[0] in {f"echo-{i}" for i in range(0, 12, 2)}]) == 6
    assert workers_left() == set()


@pytest.mark.parametrize(
    ("build", "kwargs", "message"),
    [
        ("no_colon", {"processes": 2}, "build must be 'module:function'"),
        (BUILD, {"processes": 0}, "processes must be at least 1"),
        (
            BUILD,
            {"processes": 3, "concurrency": 2},
            r"concurrency \(2\) must be at least the number of processes \(3\)",
        ),
    ],
)
def test_bad_settings_are_refused_in_one_line(build: str, kwargs: dict, message: str) -> None:
    with pytest.raises(oa.ConfigError, match=message):
        oa.ProcessRollout(build, **kwargs)

"""The run header and ``collect(resume=True)``: a file holds one run, and a resume proves it."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

import orchard_async as oa
from orchard_async.adapters.sim import SimAdapter
from orchard_async.engine.rollout import make_run_header
from orchard_async.records.trajectory import (
    FORMAT_VERSION,
    check_trajectory_file,
    read_run_header,
    run_header_differences,
)

from .test_rollout import StepsPolicy, tasks


class OtherPolicy(StepsPolicy):
    name = "other"


def files(tmp_path: Path) -> list[Path]:
    return [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("suffix", [".jsonl", ".msgpack"])
async def test_the_header_is_the_first_record_and_readers_skip_it(tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"run{suffix}"
    summary = await oa.collect(
        tasks(3), StepsPolicy(), SimAdapter(), out, n=6, group_size=2, run_header={"recipe": "x"}
    )
    assert summary.written == 6
    header = read_run_header(out)
    assert header is not None
    assert header["task_ids"] == ["t0", "t1", "t2"] and header["recipe"] == "x"
    assert (header["policy"], header["adapter"], header["episodes"], header["group_size"]) == ("steps", "sim", 6, 2)
    assert header["format"] == FORMAT_VERSION  # the records' version, unchanged by the header
    trajectories = list(oa.read_trajectories(out, strict=True))  # no warning, no error: the header is skipped
    assert len(trajectories) == 6
    if suffix == ".jsonl":
        first = out.read_bytes().splitlines()[0]
        assert json.loads(first) == {"orchard_run": header}
    else:
        size = int.from_bytes(out.read_bytes()[:4], "big")
        assert msgspec.msgpack.decode(out.read_bytes()[4 : 4 + size]) == {"orchard_run": header}


async def test_resume_refuses_a_different_run_before_creating_anything(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    await oa.collect(tasks(4), StepsPolicy(), SimAdapter(), out, n=4)
    before = out.read_bytes()
    different = [
        (dict(tasks=tasks(3)), "task ids: 0 added, 1 removed"),
        (dict(tasks=list(reversed(tasks(4)))), "task order differs"),
        (dict(policy=OtherPolicy()), "policy: steps in the file, other now"),
        (dict(n=2), "episodes: 4 in the file, 2 now"),
        (dict(n=4, group_size=2), "group_size: 1 in the file, 2 now"),
        (dict(run_header={"recipe": "swe"}), "recipe: (unset) in the file, swe now"),
    ]
    for change, message in different:
        adapter = SimAdapter()
        arguments = {"tasks": tasks(4), "policy": StepsPolicy(), "n": 4, **change}
        with pytest.raises(oa.ConfigError, match="different run") as caught:
            await oa.collect(arguments.pop("tasks"), arguments.pop("policy"), adapter, out, resume=True, **arguments)
        assert message in str(caught.value), str(caught.value)
        assert adapter.created == 0 and out.read_bytes() == before


async def test_resume_of_the_same_run_skips_what_is_done_and_may_extend_it(tmp_path: Path) -> None:
    out = tmp_path / "run.msgpack"
    await oa.collect(tasks(4), StepsPolicy(), SimAdapter(), out, n=4)
    header = read_run_header(out)
    again = await oa.collect(tasks(4), StepsPolicy(), SimAdapter(), out, n=4, resume=True)
    assert (again.skipped, again.written) == (4, 0)
    more = await oa.collect(tasks(4), StepsPolicy(), SimAdapter(), out, n=10, resume=True)
    assert (more.skipped, more.written) == (4, 6)
    assert read_run_header(out) == header  # written once, first
    trajectories = list(oa.read_trajectories(out, strict=True))
    assert sorted(t.episode_id for t in trajectories) == sorted(e.episode_id for e in oa.plan(tasks(4), 10))
    # one run id across resumes: exports tell runs apart by it
    assert {t.run_id for t in trajectories} == {header["run_id"]}


async def test_a_file_without_a_header_is_checked_on_its_records(tmp_path: Path) -> None:
    """Files written before run headers: resumable when every record belongs to this run."""
    out = tmp_path / "old.jsonl"
    with oa.TrajectoryWriter(out) as writer:  # no run_header: as the old writer did
        async for trajectory in oa.rollout(tasks(4), StepsPolicy(), SimAdapter(), n=3):
            writer.write(trajectory)
    assert read_run_header(out) is None
    before = out.read_bytes()
    with pytest.raises(oa.ConfigError, match="policy: steps in the file, other now"):
        await oa.collect(tasks(4), OtherPolicy(), SimAdapter(), out, n=4, resume=True)
    with pytest.raises(oa.ConfigError, match="which this run would not play"):
        await oa.collect(tasks(2), StepsPolicy(), SimAdapter(), out, n=4, resume=True)
    assert out.read_bytes() == before
    done = await oa.collect(tasks(4), StepsPolicy(), SimAdapter(), out, n=4, resume=True)
    assert (done.skipped, done.written) == (3, 1)


async def test_collect_checks_its_input_before_the_first_sandbox(tmp_path: Path) -> None:
    adapter = SimAdapter()
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "afile").write_text("x")
    bad = [
        (dict(out=tmp_path / "t.csv"), ".jsonl or .msgpack"),
        (dict(out=tmp_path / "dir.jsonl"), "is a directory"),
        (dict(out=tmp_path / "afile" / "t.jsonl"), "is a file, not a directory"),
        (dict(n=0), "at least 1"),  # 0 is a mistake, not "every task"
        (dict(n=-2), "at least 1"),
        (dict(n=5, group_size=2), "multiple of the group size"),
        (dict(concurrency=0), "concurrency"),
        (dict(max_retries=-1), "max_retries"),
    ]
    for change, message in bad:
        arguments = {"out": tmp_path / "new.jsonl", "n": 4, **change}
        with pytest.raises(oa.ConfigError, match=message):
            await oa.collect(tasks(4), StepsPolicy(), adapter, arguments.pop("out"), **arguments)
    assert adapter.created == 0
    assert sorted(p.name for p in files(tmp_path)) == ["afile"]


async def test_replace_keeps_the_old_file_until_an_episode_ends(tmp_path: Path) -> None:
    out = tmp_path / "demo.jsonl"
    await oa.collect(tasks(4), StepsPolicy(), SimAdapter(), out, n=4)
    before = out.read_bytes()

    class Refuses(SimAdapter):
        async def create(self, spec: oa.SandboxSpec) -> oa.Sandbox:
            raise oa.ConfigError("no image")

    with pytest.raises(BaseExceptionGroup):
        await oa.collect(tasks(2), OtherPolicy(), Refuses(), out, n=2, replace=True)
    assert out.read_bytes() == before
    await oa.collect(tasks(2), OtherPolicy(), SimAdapter(), out, n=2, replace=True)
    assert read_run_header(out)["policy"] == "other"
    assert len(list(oa.read_trajectories(out, strict=True))) == 2


def test_header_differences() -> None:
    base = make_run_header(tasks(3), StepsPolicy(), SimAdapter(), n=6, group_size=2, extra={"recipe": "toy"})
    later = {**base, "created_at": base["created_at"] + 100, "orchard_version": "9"}
    assert run_header_differences(base, later) == []
    assert run_header_differences(base, {**base, "episodes": 12}) == ["episodes: 6 in the file, 12 now"]
    assert run_header_differences(base, {**base, "episodes": 12}, allow_more_episodes=True) == []
    assert run_header_differences(base, {**base, "episodes": 4}, allow_more_episodes=True) == [
        "episodes: 6 in the file, 4 now"
    ]
    many = {**base, "task_ids": [f"t{i}" for i in range(10)]}
    assert run_header_differences(base, many) == ["task ids: 7 added, 0 removed (e.g. t3)"]
    assert run_header_differences(base, {**base, "recipe": "swe", "policy": "p"}) == [
        "policy: steps in the file, p now",
        "recipe: toy in the file, swe now",
    ]


def test_check_trajectory_file(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert check_trajectory_file(tmp_path / "empty.jsonl")  # no records: a valid, empty file
    (tmp_path / "torn.jsonl").write_bytes(b'{"episode_id":"e0","task_')  # killed at its first write
    assert check_trajectory_file(tmp_path / "torn.jsonl")
    (tmp_path / "list.jsonl").write_bytes(b"[1, 2, 3]\n")
    (tmp_path / "text.jsonl").write_bytes(b"hello")
    (tmp_path / "short.msgpack").write_bytes(b"\x00\x00")
    for name in ("list.jsonl", "text.jsonl", "short.msgpack"):
        with pytest.raises(oa.ConfigError, match="is not a trajectory file"):
            check_trajectory_file(tmp_path / name)

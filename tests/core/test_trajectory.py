"""Trajectory files: round trips, torn tails, resume bookkeeping."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import orchard_async as oa
from orchard_async.records.trajectory import finished_ids

text = st.text(max_size=40)
actions = st.builds(
    oa.Action,
    kind=st.sampled_from(["exec", "submit", "invalid"]),
    command=text,
    raw=text,
    error=text,
    usage=st.dictionaries(st.sampled_from(["prompt_tokens", "completion_tokens"]), st.integers(0, 10**6)),
)
steps = st.builds(
    oa.Step,
    index=st.integers(0, 1000),
    action=actions,
    observation=text,
    exit_code=st.none() | st.integers(-1, 255),
    reason=st.none() | st.sampled_from([r.value for r in oa.ExitReason]),
    agent_s=st.floats(0, 1e6),
    exec_s=st.floats(0, 1e6),
    stdout_cut=st.integers(0, 10**9),
)
trajectories = st.builds(
    oa.Trajectory,
    episode_id=text,
    task_id=text,
    group_id=text,
    sample=st.integers(0, 100),
    policy=text,
    adapter=text,
    run_id=text,
    status=st.sampled_from(["finished", "failed"]),
    end_reason=text,
    reward=st.floats(-1e6, 1e6),
    success=st.booleans(),
    steps=st.lists(steps, max_size=4),
    ops=st.lists(
        st.builds(oa.Op, name=text, start=st.floats(0, 1e6), duration=st.floats(0, 1e6), outcome=text), max_size=3
    ),
    retries=st.lists(
        st.builds(oa.Retry, attempt=st.integers(0, 5), reason=text, error=text, duration=st.floats(0, 1e3)), max_size=2
    ),
    timings=st.dictionaries(st.sampled_from(["create", "exec", "total"]), st.floats(0, 1e6)),
    info=st.dictionaries(text, st.integers(-(2**63), 2**63 - 1) | text | st.booleans()),
    error=text,
)


@pytest.mark.parametrize("suffix", [".jsonl", ".msgpack"])
@given(items=st.lists(trajectories, max_size=5))
@settings(max_examples=60, deadline=None)
def test_round_trip(tmp_path_factory: pytest.TempPathFactory, suffix: str, items: list[oa.Trajectory]) -> None:
    path = tmp_path_factory.mktemp("traj") / f"t{suffix}"
    with oa.TrajectoryWriter(path) as writer:
        for item in items:
            writer.write(item)
    if not items:  # a writer that wrote nothing created nothing
        assert not path.exists()
        return
    assert list(oa.read_trajectories(path, strict=True)) == items


def _sample(i: int) -> oa.Trajectory:
    return oa.Trajectory(
        episode_id=f"e{i}",
        task_id="t",
        group_id="g",
        sample=i,
        policy="p",
        adapter="sim",
        run_id="r",
        status="finished",
        end_reason="submitted",
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".msgpack"])
def test_a_torn_record_is_skipped_and_appending_goes_on(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"t{suffix}"
    with oa.TrajectoryWriter(path) as writer:
        writer.write(_sample(0))
        writer.write(_sample(1))
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])  # a writer killed mid-record
    assert [t.episode_id for t in oa.read_trajectories(path)] == ["e0"]
    with oa.TrajectoryWriter(path) as writer:
        writer.write(_sample(2))
    assert [t.episode_id for t in oa.read_trajectories(path, strict=True)] == ["e0", "e2"]
    assert finished_ids(path) == {"e0", "e2"}
    if suffix == ".jsonl":  # never cut: the torn line stays, ended by a newline, and is skipped
        assert path.read_bytes().startswith(whole[:-7] + b"\n")
    else:  # framing leaves no choice: the torn record (clearly one of ours) was dropped
        first = 4 + int.from_bytes(whole[:4], "big")
        assert path.read_bytes()[:first] == whole[:first]
        assert len(path.read_bytes()) == len(whole)  # e0, then e2 (as long as e1): no torn bytes left


def test_msgpack_refuses_to_append_after_bytes_it_did_not_write(tmp_path: Path) -> None:
    path = tmp_path / "t.msgpack"
    with oa.TrajectoryWriter(path) as writer:
        writer.write(_sample(0))
    record = path.read_bytes()
    # a length prefix promising more than there is, then not our map; a cut length prefix
    for tail in (b"\x00\x00\x10\x00not ours", b"\x01\x02"):
        path.write_bytes(record + tail)
        with pytest.raises(oa.ConfigError, match="not a record this program wrote"):
            oa.TrajectoryWriter(path)
        assert path.read_bytes() == record + tail


def test_jsonl_appends_after_a_foreign_tail_without_touching_it(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with oa.TrajectoryWriter(path) as writer:
        writer.write(_sample(0))
    path.write_bytes(path.read_bytes() + b"a note someone typed")
    before = path.read_bytes()
    with oa.TrajectoryWriter(path) as writer:
        writer.write(_sample(1))
    assert path.read_bytes().startswith(before + b"\n")
    assert [t.episode_id for t in oa.read_trajectories(path)] == ["e0", "e1"]  # skipped with a warning
    with pytest.raises(oa.ConfigError, match="corrupt record"):  # not torn: strict readers refuse it
        list(oa.read_trajectories(path, strict=True))


def test_jsonl_is_plain_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with oa.TrajectoryWriter(path) as writer:
        writer.write(_sample(0))
    (line,) = path.read_text().splitlines()
    assert msgspec.json.decode(line)["episode_id"] == "e0"


def test_unknown_extension_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(oa.ConfigError, match=".jsonl or .msgpack"):
        oa.TrajectoryWriter(tmp_path / "t.csv")
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(oa.ConfigError, match="is a directory"):
        oa.TrajectoryWriter(tmp_path / "d.jsonl")
    (tmp_path / "d.jsonl").rmdir()
    oa.TrajectoryWriter(tmp_path / "sub" / "t.jsonl").close()  # nothing written: nothing made
    assert not os.listdir(tmp_path)


def test_end_reasons_are_plain_strings_in_files_read_back_as_members_and_any_string_reads(tmp_path: Path) -> None:
    written = [*oa.EndReason, "cancelled"]  # a value no EndReason names (an old or foreign file's) still reads
    for suffix in (".jsonl", ".msgpack"):
        path = tmp_path / f"t{suffix}"
        with oa.TrajectoryWriter(path) as writer:
            for index, reason in enumerate(written):
                writer.write(
                    oa.Trajectory(
                        episode_id=f"e{index}", task_id="t", group_id="g", sample=0, policy="p", adapter="sim",
                        run_id="r", status="finished" if reason in ("submitted", "deadline") else "failed",
                        end_reason=reason,
                    )
                )  # fmt: skip
        read = list(oa.read_trajectories(path, strict=True))
        assert [t.end_reason for t in read] == [str(reason) for reason in written]
        assert [t.end_reason for t in read[:-1]] == list(oa.EndReason)
        assert all(t.end_reason is reason for t, reason in zip(read, oa.EndReason, strict=False))
        foreign = read[-1].end_reason  # an EndReason of its own value, neither scored nor the backend's
        assert isinstance(foreign, oa.EndReason) and foreign == "cancelled" and str(foreign) == "cancelled"
        assert not foreign.scored and not foreign.is_infra and foreign not in list(oa.EndReason)
    assert b'"end_reason":"model_unavailable"' in (tmp_path / "t.jsonl").read_bytes()


def test_every_end_reason_is_scored_infrastructure_or_the_episodes_own() -> None:
    scored = {reason for reason in oa.EndReason if reason.scored}
    infra = {reason for reason in oa.EndReason if reason.is_infra}
    assert scored == {"submitted", "max_steps", "deadline", "context_exhausted", "parse_failures"}
    assert infra == {"create_failed", "sandbox_lost", "verifier_error", "model_unavailable", "infra_error", "aborted"}
    assert set(oa.EndReason) - scored - infra == {"policy_error", "task_error"}
    errors = {
        oa.CreateFailed: "create_failed",
        oa.SandboxLost: "sandbox_lost",
        oa.VerifierError: "verifier_error",
        oa.ModelUnavailable: "model_unavailable",
        oa.BackendUnavailable: "infra_error",
        oa.InfraError: "infra_error",
    }
    assert {error: oa.EndReason.of_infra_error(error("x")) for error in errors} == errors

"""Trajectories out as SFT chats and GRPO groups, from a real rollout written to disk."""

from __future__ import annotations

import json

import anyio
import msgspec
import pytest

import orchard_async as oa
from orchard_async.recipes import swe
from orchard_async.recipes.swe.export import main as export_main


class MixedPolicy:
    """Sample 0 of each group plays the oracle, the others submit nothing: groups with signal."""

    name = "mixed"

    def __init__(self):
        self.oracle, self.empty = swe.OraclePolicy(), swe.EmptyPolicy()

    async def act(self, observation: oa.Observation) -> oa.Action:
        first = observation.episode_id.endswith("/s0")
        return await (self.oracle if first else self.empty).act(observation)


@pytest.fixture(scope="module")
def trajectory_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("swe-export") / "run.jsonl"
    tasks = swe.load_tasks("builtin:minicalc__4,datespan__2")

    async def go():
        adapter = oa.get_adapter("local", root=str(out.parent / "sbx"))
        try:
            await oa.collect(tasks, MixedPolicy(), adapter, out, n=4, group_size=2, concurrency=2)
        finally:
            await adapter.close()
        # one infrastructure failure, as the engine records it: must be left out of the data
        with oa.TrajectoryWriter(out) as writer:
            writer.write(
                oa.Trajectory(episode_id="minicalc__4/g9/s0", task_id="minicalc__4", group_id="minicalc__4/g9", sample=0,
                              policy="mixed", adapter="local", run_id="x", status="failed", end_reason="sandbox_lost")
            )

    anyio.run(go)
    return out


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sft_export(trajectory_file, tmp_path):
    summary = swe.export_sft(trajectory_file, tmp_path / "sft.jsonl")
    assert (summary.records, summary.skipped) == (4, 1)
    assert summary.resolved_rate == pytest.approx(2 / 4)
    records = read_jsonl(tmp_path / "sft.jsonl")
    for record in records:
        roles = [m["role"] for m in record["messages"]]
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
        assert all(a != b for a, b in zip(roles[1:], roles[2:], strict=False))  # strictly alternating
        assert record["messages"][-1]["content"].endswith("```bash\nsubmit\n```")
        assert record["reward"] == (1.0 if record["resolved"] else 0.0)
        assert "<issue>" in record["messages"][1]["content"]
    resolved = [r for r in records if r["resolved"]]
    assert {r["episode_id"].rsplit("/", 1)[1] for r in resolved} == {"s0"}
    assert all(r["turns"] == 3 and r["patch"].startswith("diff --git") for r in resolved)
    assert "<returncode>0</returncode>" in resolved[0]["messages"][3]["content"]
    only = swe.export_sft(trajectory_file, tmp_path / "sft-ok.jsonl", only_resolved=True)
    assert (only.records, only.skipped, only.resolved_rate) == (2, 3, 1.0)


def test_grpo_export(trajectory_file, tmp_path):
    summary = swe.export_grpo(trajectory_file, tmp_path / "grpo.jsonl")
    assert (summary.records, summary.episodes, summary.skipped, summary.groups_degenerate) == (2, 4, 1, 0)
    groups = read_jsonl(tmp_path / "grpo.jsonl")
    assert sorted(g["instance_id"] for g in groups) == ["datespan__2", "minicalc__4"]
    for group in groups:
        stats = group["stats"]
        assert stats["size"] == 2 and stats["resolved"] == 1
        assert stats["mean"] == pytest.approx(0.5) and stats["std"] == pytest.approx(0.5)
        assert (stats["min"], stats["max"], stats["degenerate"]) == (0.0, 1.0, False)
        assert [m["role"] for m in group["prompt"]] == ["system", "user"]
        assert [s["sample"] for s in group["samples"]] == [0, 1]
        advantages = [s["advantage"] for s in group["samples"]]
        assert advantages == pytest.approx([1.0, -1.0], abs=1e-5)
        assert all(s["completion"][0]["role"] == "assistant" for s in group["samples"])
    # a degenerate group (same reward everywhere) can be dropped; small groups too
    dropped = swe.export_grpo(trajectory_file, tmp_path / "g2.jsonl", min_group_size=3)
    assert (dropped.records, dropped.skipped) == (0, 5)


def test_export_command_line(trajectory_file, tmp_path, capsys):
    assert export_main(["grpo", str(trajectory_file), "--out", str(tmp_path / "g.jsonl"), "--skip-degenerate"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["records"] == 2 and printed["groups_degenerate"] == 0
    assert export_main(["sft", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "s.jsonl")]) == 2
    assert "no such trajectory file" in capsys.readouterr().err


def test_degenerate_groups_are_flagged_and_can_be_dropped(trajectory_file, tmp_path):
    real = list(oa.read_trajectories(trajectory_file))
    winner = next(t for t in real if t.success)
    same = [msgspec.structs.replace(winner, episode_id=f"x/g0/s{i}", group_id="x/g0", sample=i) for i in range(2)]
    kept = swe.export_grpo(real + same, tmp_path / "all.jsonl")
    assert (kept.records, kept.groups_degenerate) == (3, 1)
    flagged = [g for g in read_jsonl(tmp_path / "all.jsonl") if g["stats"]["degenerate"]]
    assert [g["group_id"] for g in flagged] == ["x/g0"] and flagged[0]["stats"]["std"] == 0.0
    assert all(s["advantage"] == 0.0 for s in flagged[0]["samples"])
    dropped = swe.export_grpo(real + same, tmp_path / "signal.jsonl", skip_degenerate=True)
    assert (dropped.records, dropped.skipped) == (2, 3)

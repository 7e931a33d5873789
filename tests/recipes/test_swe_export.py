"""Trajectories out as SFT chats and RL samples, from real rollouts written to disk.

The main run mixes every way an episode can end: resolved and unresolved submissions, an
episode out of context (scored), one out of context before its first reply, a policy that
crashes, a verifier that cannot run (every sample of a group) and a model server that is
down (half of a group). Only the scored episodes may become data.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass

import anyio
import msgspec
import pytest

import orchard_async as oa
from orchard_async.recipes import swe
from orchard_async.recipes.swe.export import main as export_main

RUN = "run-a"
# What each sample does, by "g<group>/s<sample>". Groups: g0 and g3 are minicalc__4, g1 is
# datespan__2, g2 is minicalc__1 with a verifier that cannot run.
FATES = {
    "g0/s0": "oracle",
    "g0/s1": "empty",
    "g0/s2": "fix_then_out_of_context",
    "g0/s3": "out_of_context_at_once",
    "g1/s0": "oracle",
    "g1/s1": "empty",
    "g1/s2": "empty",
    "g1/s3": "crash",
    "g2/s0": "oracle",
    "g2/s1": "oracle",
    "g2/s2": "empty",
    "g2/s3": "empty",
    "g3/s0": "oracle",
    "g3/s1": "empty",
    "g3/s2": "model_down",
    "g3/s3": "model_down",
}
UNJUDGED = {"verifier_error", "model_unavailable", "policy_error", "sandbox_lost", "create_failed", "infra_error"}


class FatePolicy:
    name = "fates"

    def __init__(self):
        self.oracle, self.empty = swe.OraclePolicy(), swe.EmptyPolicy()

    async def act(self, observation: oa.Observation) -> oa.Action:
        fate = FATES.get(observation.episode_id.split("/", 1)[1], "empty")
        if fate == "crash":
            raise RuntimeError("the policy's own bug")
        if fate == "model_down":
            raise oa.ModelUnavailable("http://127.0.0.1:9/v1 answered HTTP 401: bad key")
        if fate == "out_of_context_at_once" or (fate == "fix_then_out_of_context" and observation.step >= 1):
            raise oa.ContextExhausted("the context is full")
        return await (self.empty if fate == "empty" else self.oracle).act(observation)


class MixedPolicy:
    """Sample 0 of each group plays the oracle, the others submit nothing."""

    name = "mixed"

    def __init__(self):
        self.oracle, self.empty = swe.OraclePolicy(), swe.EmptyPolicy()

    async def act(self, observation: oa.Observation) -> oa.Action:
        first = observation.episode_id.endswith("/s0")
        return await (self.oracle if first else self.empty).act(observation)


@dataclass
class VerifierCannotRun:
    """A task whose test runner is missing: scoring crashes, so nothing is judged."""

    inner: swe.SWETask

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def evaluate(self, sandbox):  # scoring in the agent's own sandbox
        raise RuntimeError("/bin/sh: 1: python: not found")

    async def grade(self, submission, sandbox):  # scoring in a clean sandbox
        raise RuntimeError("/bin/sh: 1: python: not found")


async def collect(tasks, policy, out, *, run_id, n, group_size, resume=False):
    adapter = oa.get_adapter("local", root=str(out.parent / "sbx"))
    try:
        await oa.collect(
            tasks, policy, adapter, out, n=n, group_size=group_size, concurrency=4, max_retries=1,
            retry_backoff=0.01, run_id=run_id, resume=resume,
        )  # fmt: skip
    finally:
        await adapter.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``a``: the mixed run above; ``b``: another run of minicalc__4 (same episode ids as
    ``a``'s g0); ``resumed``: a run killed after one sample and continued with --resume."""
    root = tmp_path_factory.mktemp("swe-export")
    by_id = {task.id: task for task in swe.load_tasks("builtin:minicalc__4,datespan__2,minicalc__1")}
    minicalc4, datespan2, minicalc1 = by_id["minicalc__4"], by_id["datespan__2"], by_id["minicalc__1"]
    files = {name: root / f"{name}.jsonl" for name in ("a", "b", "resumed")}

    async def go():
        tasks = [minicalc4, datespan2, VerifierCannotRun(minicalc1)]
        await collect(tasks, FatePolicy(), files["a"], run_id=RUN, n=16, group_size=4)
        await collect([minicalc4], MixedPolicy(), files["b"], run_id="run-b", n=2, group_size=2)
        # the first invocation finished s0 only, then the run was continued (a new run id)
        (first,) = [line for line in files["b"].read_text().splitlines(keepends=True) if '/s0"' in line]
        files["resumed"].write_text(first)
        await collect([minicalc4], MixedPolicy(), files["resumed"], run_id="run-c", n=2, group_size=2, resume=True)

    anyio.run(go)
    return files


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_run_has_every_kind_of_ending(runs):
    ends = defaultdict(list)
    for t in oa.read_trajectories(runs["a"]):
        ends[t.end_reason].append(t.episode_id.split("/", 1)[1])
    assert sorted(ends["verifier_error"]) == ["g2/s0", "g2/s1", "g2/s2", "g2/s3"]
    assert sorted(ends["model_unavailable"]) == ["g3/s2", "g3/s3"]
    assert ends["policy_error"] == ["g1/s3"]
    assert sorted(ends["context_exhausted"]) == ["g0/s2", "g0/s3"]
    assert sorted(ends["submitted"]) == ["g0/s0", "g0/s1", "g1/s0", "g1/s1", "g1/s2", "g3/s0", "g3/s1"]


def test_sft_export_keeps_resolved_chats_by_default(runs, tmp_path):
    summary = swe.export_sft(runs["a"], tmp_path / "sft.jsonl")
    records = read_jsonl(tmp_path / "sft.jsonl")
    assert {r["episode_id"].split("/", 1)[1] for r in records} == {"g0/s0", "g0/s2", "g1/s0", "g3/s0"}
    assert (summary.records, summary.episodes, summary.skipped) == (4, 4, 12)
    assert summary.skipped_reasons == {
        "verifier_error": 4, "model_unavailable": 2, "policy_error": 1, "unresolved": 5,
    }  # fmt: skip
    assert (summary.resolved_rate, summary.mean_reward, summary.runs) == (1.0, 1.0, [RUN])
    for record in records:
        roles = [m["role"] for m in record["messages"]]
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
        assert all(a != b for a, b in zip(roles[1:], roles[2:], strict=False))  # strictly alternating
        assert set().union(*(m.keys() for m in record["messages"])) == {"role", "content"}  # plain chat
        assert "<issue>" in record["messages"][1]["content"]
        assert record["resolved"] and record["reward"] == 1.0 and record["patch"].startswith("diff --git")
        assert record["group_id"] == f"{RUN}/{record['episode_id'].rsplit('/', 1)[0]}"
    by_fate = {r["episode_id"].split("/", 1)[1]: r for r in records}
    assert by_fate["g0/s0"]["messages"][-1]["content"].endswith("```bash\nsubmit\n```")
    assert "<returncode>0</returncode>" in by_fate["g0/s0"]["messages"][3]["content"]
    # out of context after the fix: scored and resolved; the chat ends on the model's last reply
    ran_out = by_fate["g0/s2"]
    assert ran_out["end_reason"] == "context_exhausted" and len(ran_out["messages"]) == 3
    assert "git apply" in ran_out["messages"][-1]["content"]


def test_sft_min_reward_threshold(runs, tmp_path):
    everything = swe.export_sft(runs["a"], tmp_path / "all.jsonl", min_reward=0.0)
    records = read_jsonl(tmp_path / "all.jsonl")
    # every scored episode but the one that ran out of context before its first reply
    assert (everything.records, everything.skipped_reasons["no_assistant_turn"]) == (8, 1)
    assert all(any(m["role"] == "assistant" for m in r["messages"]) for r in records)
    assert everything.resolved_rate == pytest.approx(4 / 8) and everything.mean_reward == pytest.approx(0.5)
    strict = swe.export_sft(runs["a"], tmp_path / "strict.jsonl", min_reward=1.5)
    assert (strict.records, strict.skipped_reasons["below_min_reward"]) == (0, 9)


def test_rl_file_read_as_a_trainer_reads_it(runs, tmp_path):
    summary = swe.export.export_rl(runs["a"], tmp_path / "rl.jsonl")
    assert (summary.records, summary.episodes, summary.groups, summary.skipped) == (9, 9, 3, 7)
    assert (summary.groups_partial, summary.groups_degenerate) == (2, 0)

    # a trainer: one JSON object per line, batched by group_id
    groups = defaultdict(list)
    with open(tmp_path / "rl.jsonl", encoding="utf-8") as fh:
        for line in fh:
            sample = json.loads(line)
            groups[sample["group_id"]].append(sample)
    assert sorted(groups) == [f"{RUN}/datespan__2/g1", f"{RUN}/minicalc__4/g0", f"{RUN}/minicalc__4/g3"]
    assert {g: [s["reward"] for s in samples] for g, samples in groups.items()} == {
        f"{RUN}/minicalc__4/g0": [1.0, 0.0, 1.0, 0.0],
        f"{RUN}/datespan__2/g1": [1.0, 0.0, 0.0],  # s3 crashed: left out
        f"{RUN}/minicalc__4/g3": [1.0, 0.0],  # s2 and s3 could not reach the model: left out
    }
    for group_id, samples in groups.items():
        rewards = [s["reward"] for s in samples]
        mean = sum(rewards) / len(rewards)
        assert math.fsum(s["advantage"] for s in samples) == pytest.approx(0.0, abs=1e-9)
        assert [s["advantage"] for s in samples] == pytest.approx([r - mean for r in rewards])
        assert all(s["group"]["size"] == len(samples) and s["group"]["mean"] == pytest.approx(mean) for s in samples)
        assert {s["group"]["dropped"] for s in samples} == {
            0 if group_id.endswith("g0") else (1 if "g1" in group_id else 2)
        }
        for sample in samples:
            assert sample["run_id"] == RUN and sample["end_reason"] not in UNJUDGED
            messages, prompt = sample["messages"], sample["prompt"]
            # the prompt is the conversation before the model's first turn, without masks
            assert [m["role"] for m in prompt] == ["system", "user"]
            assert [{"role": m["role"], "content": m["content"]} for m in messages[: len(prompt)]] == prompt
            # the loss mask: the model's own turns, never an observation or the prompt
            assert [m["train"] for m in messages] == [m["role"] == "assistant" for m in messages]
            text = "".join(m["content"] for m in messages)
            trained = "".join(m["content"] for m in messages if m["train"])
            assert "<returncode>" not in trained and "<issue>" not in trained
            assert len(trained) < len(text)
    no_reply = [s for s in groups[f"{RUN}/minicalc__4/g0"] if s["episode_id"].endswith("/s3")]
    # out of context before replying: scored (reward 0), in the group's baseline, nothing to train on
    assert no_reply[0]["end_reason"] == "context_exhausted" and not any(m["train"] for m in no_reply[0]["messages"])


def test_rl_advantage_scaled_by_std_and_group_options(runs, tmp_path):
    scaled = swe.export.export_rl(runs["a"], tmp_path / "std.jsonl", advantage="std")
    samples = read_jsonl(tmp_path / "std.jsonl")
    for sample in samples:
        group = sample["group"]
        expected = (sample["reward"] - group["mean"]) / (group["std"] + 1e-6)
        assert sample["advantage"] == pytest.approx(expected)
    by_group = defaultdict(list)
    for sample in samples:
        by_group[sample["group_id"]].append(sample["advantage"])
    assert all(abs(math.fsum(a)) < 1e-6 for a in by_group.values()) and scaled.records == 9
    assert sorted(by_group[f"{RUN}/minicalc__4/g0"]) == pytest.approx([-1, -1, 1, 1], abs=1e-5)

    complete = swe.export.export_rl(runs["a"], tmp_path / "complete.jsonl", complete_groups_only=True)
    assert (complete.groups, complete.records, complete.skipped_reasons["partial_group"]) == (1, 4, 5)
    big = swe.export.export_rl(runs["a"], tmp_path / "big.jsonl", min_group_size=3)
    assert (big.groups, big.records, big.skipped_reasons["small_group"]) == (2, 7, 2)


def test_unjudged_episodes_are_absent_from_every_export(runs, tmp_path):
    unjudged = {t.episode_id for t in oa.read_trajectories(runs["a"]) if t.end_reason in UNJUDGED}
    assert len(unjudged) == 7
    exports = {
        "sft": swe.export_sft(runs["a"], tmp_path / "sft.jsonl"),
        "sft-any-reward": swe.export_sft(runs["a"], tmp_path / "sft-any-reward.jsonl", min_reward=-1e9),
        "rl": swe.export.export_rl(runs["a"], tmp_path / "rl.jsonl"),
        "rl-std": swe.export.export_rl(runs["a"], tmp_path / "rl-std.jsonl", advantage="std"),
        "grpo": swe.export_grpo(runs["a"], tmp_path / "grpo.jsonl"),
    }
    for name, summary in exports.items():
        written = {r["episode_id"] for r in read_jsonl(tmp_path / f"{name}.jsonl")}
        assert written and not written & unjudged, name
        assert summary.skipped_reasons["verifier_error"] == 4 and summary.skipped_reasons["model_unavailable"] == 2


def test_runs_are_not_mixed_unless_asked(runs, tmp_path):
    out = tmp_path / "rl.jsonl"
    with pytest.raises(oa.ConfigError, match=r"2 different runs \(run-a, run-b\).*--allow-mixed-runs"):
        swe.export.export_rl([runs["a"], runs["b"]], out)
    assert not out.exists()
    mixed = swe.export.export_rl([runs["a"], runs["b"]], out, allow_mixed_runs=True)
    assert (mixed.groups, mixed.records, mixed.runs) == (4, 11, [RUN, "run-b"])
    groups = {r["group_id"] for r in read_jsonl(out)}
    assert {f"{RUN}/minicalc__4/g0", "run-b/minicalc__4/g0"} <= groups  # same rollout group id, kept apart

    # files concatenated by hand: the episode ids repeat, so the file is two runs
    concatenated = tmp_path / "cat.jsonl"
    concatenated.write_bytes(runs["a"].read_bytes() + runs["b"].read_bytes())
    with pytest.raises(oa.ConfigError, match="holds 2 runs .* concatenated"):
        swe.export_sft(concatenated, tmp_path / "sft.jsonl")
    apart = swe.export.export_rl(concatenated, tmp_path / "cat-rl.jsonl", allow_mixed_runs=True)
    assert (apart.groups, apart.records) == (4, 11)

    # the same run twice is never two runs' worth of data
    with pytest.raises(oa.ConfigError, match="in the inputs twice"):
        swe.export.export_rl([runs["b"], runs["b"]], out, allow_mixed_runs=True)


def test_a_resumed_run_is_one_run_with_whole_groups(runs, tmp_path):
    run_ids = [t.run_id for t in oa.read_trajectories(runs["resumed"])]
    assert run_ids == ["run-b", "run-c"]  # each invocation drew its own id
    summary = swe.export.export_rl(runs["resumed"], tmp_path / "rl.jsonl")
    records = read_jsonl(tmp_path / "rl.jsonl")
    assert (summary.groups, summary.records, summary.runs) == (1, 2, ["run-b"])
    assert {r["group_id"] for r in records} == {"run-b/minicalc__4/g0"}
    assert [r["advantage"] for r in records] == pytest.approx([0.5, -0.5])


def test_degenerate_groups_are_flagged_and_can_be_dropped(runs, tmp_path):
    real = list(oa.read_trajectories(runs["a"]))
    winner = next(t for t in real if t.success)
    same = [msgspec.structs.replace(winner, episode_id=f"x/g0/s{i}", group_id="x/g0", sample=i) for i in range(2)]
    kept = swe.export.export_rl(real + same, tmp_path / "all.jsonl")
    assert (kept.groups, kept.groups_degenerate, kept.records) == (4, 1, 11)
    flagged = [s for s in read_jsonl(tmp_path / "all.jsonl") if s["group"]["degenerate"]]
    assert {s["group_id"] for s in flagged} == {f"{RUN}/x/g0"} and flagged[0]["group"]["std"] == 0.0
    assert all(s["advantage"] == 0.0 for s in flagged)
    dropped = swe.export.export_rl(real + same, tmp_path / "signal.jsonl", skip_degenerate=True)
    assert (dropped.groups, dropped.records, dropped.skipped_reasons["degenerate_group"]) == (3, 9, 2)


def test_export_command_line(runs, tmp_path, capsys):
    assert export_main(["rl", str(runs["a"]), "--out", str(tmp_path / "g.jsonl"), "--advantage", "std"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["records"], printed["groups"], printed["skipped"]) == (9, 3, 7)
    assert export_main(["grpo", str(runs["a"]), "--out", str(tmp_path / "g2.jsonl")]) == 0  # the former name
    assert export_main(["rl", str(runs["a"]), "--out", str(tmp_path / "g3.jsonl")]) == 0
    assert read_jsonl(tmp_path / "g2.jsonl") == read_jsonl(tmp_path / "g3.jsonl") != read_jsonl(tmp_path / "g.jsonl")
    capsys.readouterr()
    assert export_main(["sft", str(runs["a"]), "--out", str(tmp_path / "s.jsonl"), "--min-reward", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 8

    def fails(*argv):
        assert export_main(list(argv)) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        return err

    assert "no such trajectory file" in fails("sft", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "s.jsonl"))
    assert "--allow-mixed-runs" in fails("rl", str(runs["a"]), str(runs["b"]), "--out", str(tmp_path / "m.jsonl"))
    assert "is a directory" in fails("sft", str(runs["a"]), "--out", str(tmp_path))
    assert "one of the input" in fails("sft", str(runs["a"]), "--out", str(runs["a"]))
    assert "not a file" in fails("sft", str(tmp_path), "--out", str(tmp_path / "x.jsonl"))
    assert "finite" in fails("sft", str(runs["a"]), "--out", str(tmp_path / "x.jsonl"), "--min-reward", "nan")
    assert not (tmp_path / "m.jsonl").exists() and not (tmp_path / "x.jsonl").exists()
    assert (
        export_main(["rl", str(runs["a"]), str(runs["b"]), "--out", str(tmp_path / "m.jsonl"), "--allow-mixed-runs"])
        == 0
    )


def test_orchard_async_export_prints_the_summary(runs, tmp_path, capsys):
    """The `orchard-async export` command reads the summary fields it prints."""
    from orchard_async.apps.cli import main as cli_main

    assert cli_main(["export", "rl", str(runs["a"]), "--out", str(tmp_path / "rl.jsonl"), "--recipe", "swe"]) == 0
    printed = capsys.readouterr().err.replace("\n", "")  # the console wraps a long path anywhere
    assert "rl: 9 records (9 episodes, 7 skipped)" in printed and "rl.jsonl" in printed

"""Exit codes a script can trust: `run` and `demo` exit 1 when too few episodes were judged,
2 (one line, before the first sandbox) for a recipe on an adapter it cannot run on and for a
service URL where nothing answers; summaries never rate episodes nobody judged."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchard_async.adapters.sim import SimAdapter
from orchard_async.apps import cli
from orchard_async.records.trajectory import read_trajectories


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHARD_LOCAL_ROOT", str(tmp_path / "sandboxes"))
    return tmp_path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def sim_options(**config: object) -> str:
    return json.dumps(config)


def test_demo_on_sim_is_refused_in_one_line_before_any_sandbox(capsys, monkeypatch, tmp_path) -> None:
    def no_sandbox(*args: object, **kwargs: object) -> None:
        raise AssertionError("a sandbox was asked for")

    monkeypatch.setattr(SimAdapter, "create", no_sandbox)
    code, out = run_cli(capsys, "demo", "--adapter", "sim", "--out", "demo")
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert "the swe recipe cannot run on the sim adapter" in out and "runs_commands" in out
    assert not (tmp_path / "demo" / "trajectories.jsonl").exists()
    for recipe in ("swe", "gui", "claw"):
        code, out = run_cli(capsys, "run", recipe, "--adapter", "sim", "--out", f"{recipe}.jsonl")
        assert code == 2 and f"the {recipe} recipe cannot run on the sim adapter" in out, out


def test_toy_still_runs_on_sim(capsys) -> None:
    code, out = run_cli(capsys, "run", "--adapter", "sim", "--episodes", "4", "--out", "toy.jsonl")
    assert code == 0, out  # every episode judged (unsolved: the sim only pretends to run commands)


def test_no_episode_judged_is_exit_1_and_no_rate(capsys) -> None:
    options = sim_options(create_failure_rate=1.0)
    argv = ["run", "--adapter", "sim", "--adapter-options", options, "--episodes", "4", "--max-retries", "0"]
    code, out = run_cli(capsys, *argv, "--out", "t.jsonl")
    assert code == 1 and "0 of 4 episodes were judged" in out and "create_failed 4" in out, out
    assert "- (none judged)" in out and "0.0%" not in out  # the table rates nothing
    code, out = run_cli(capsys, "inspect", "t.jsonl", "--json")
    summary = json.loads(out)
    assert code == 0 and summary["judged"] == 0 and summary["success_rate"] is None and summary["mean_reward"] is None


def test_min_judged_sets_the_bar(capsys) -> None:
    options = sim_options(create_failure_rate=0.5, seed=3)
    argv = ["run", "--adapter", "sim", "--adapter-options", options, "--episodes", "10", "--max-retries", "0"]
    code, out = run_cli(capsys, *argv, "--out", "a.jsonl")
    judged = sum(t.status == "finished" for t in read_trajectories("a.jsonl"))
    assert 0 < judged < 10, "the seed should fail some creates and not others"
    assert code == 0, out  # the default bar: at least one judged
    code, out = run_cli(capsys, *argv, "--out", "b.jsonl", "--min-judged", "1")
    assert code == 1 and f"{judged} of 10 episodes were judged, below --min-judged 1" in out, out
    code, out = run_cli(capsys, *argv, "--out", "c.jsonl", "--min-judged", str(judged / 10))
    assert code == 0, out  # exactly at the bar
    code, out = run_cli(capsys, *argv, "--out", "d.jsonl", "--min-judged", "1.5")
    assert code == 2 and "fraction from 0 to 1" in out


def test_a_remote_url_where_nothing_answers_is_one_line_and_exit_2_within_seconds(capsys, tmp_path) -> None:
    started = time.monotonic()
    options = json.dumps({"url": "http://127.0.0.1:9"})  # the discard port: nothing listens
    code, out = run_cli(capsys, "run", "--adapter", "remote", "--adapter-options", options, "--out", "r.jsonl")
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert "no orchard-async service answers at http://127.0.0.1:9" in out
    assert time.monotonic() - started < 10 and not (tmp_path / "r.jsonl").exists()

"""The command line, run as a user would: a subprocess per command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import orchard_async as oa
from orchard_async.adapters.local import _sandbox_processes
from orchard_async.records.trajectory import read_run_header


def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchard_async.apps.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.fixture
def local_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    import os

    root = tmp_path / "sandboxes"
    return {**os.environ, "ORCHARD_LOCAL_ROOT": str(root)}


def test_demo_writes_readable_trajectories_and_leaves_nothing(tmp_path: Path, local_env: dict) -> None:
    # 8 episodes: the README's whole demo (32) runs from a bare venv in tests/test_fresh_install.py.
    done = cli("demo", "--episodes", "8", "--out", "D", cwd=tmp_path, env=local_env)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "D" / "trajectories.jsonl"
    header_line, *lines = path.read_bytes().splitlines()
    header = json.loads(header_line)["orchard_run"]  # the run header: plain JSON, first line
    assert header["recipe"] == "swe" and header["policy"] == "oracle" and header["episodes"] == 8
    assert header == read_run_header(path)
    trajectories = [msgspec.json.decode(line, type=oa.Trajectory) for line in lines]
    assert len(trajectories) == 8 and all(t.success for t in trajectories)
    assert [t.episode_id for t in trajectories] == [t.episode_id for t in oa.read_trajectories(path, strict=True)]
    assert "sandboxes leaked" in done.stdout and "100.0%" in done.stdout
    root = Path(local_env["ORCHARD_LOCAL_ROOT"])
    assert not root.exists() or not any(root.iterdir())
    assert not [d for d in _sandbox_processes() if Path(d).parent == root]

    summary = json.loads(cli("inspect", str(path), "--json", cwd=tmp_path).stdout)
    assert summary["episodes"] == 8 and summary["finished"] == 8 and summary["failed"] == 0
    assert summary["success_rate"] == 1.0 and summary["mean_reward"] == 1.0
    assert summary["exit_reasons"] == {"submitted": 8}
    assert summary["verifier_errors"] == 0 and summary["model_unavailable"] == 0


def test_run_random_policy_resume_and_groups(tmp_path: Path, local_env: dict) -> None:
    out = tmp_path / "r.msgpack"
    first = cli(
        "run",
        "--policy",
        "random",
        "--episodes",
        "12",
        "--group-size",
        "3",
        "--out",
        str(out),
        cwd=tmp_path,
        env=local_env,
    )
    assert first.returncode == 0, first.stderr
    again = cli(
        "run",
        "--policy",
        "random",
        "--episodes",
        "12",
        "--group-size",
        "3",
        "--out",
        str(out),
        cwd=tmp_path,
        env=local_env,
    )
    assert again.returncode == 2 and "--resume" in again.stderr
    more = cli(
        "run",
        "--policy",
        "random",
        "--episodes",
        "18",
        "--group-size",
        "3",
        "--out",
        str(out),
        "--resume",
        cwd=tmp_path,
        env=local_env,
    )
    assert more.returncode == 0, more.stderr
    trajectories = list(oa.read_trajectories(out))
    assert len(trajectories) == 18 and len({t.episode_id for t in trajectories}) == 18
    assert {t.group_id for t in trajectories} == {e.group_id for e in oa.plan(load_toy(), 18, 3)}
    summary = json.loads(cli("inspect", str(out), "--json", cwd=tmp_path).stdout)
    assert summary["success_rate"] < 0.5  # random is usually wrong


def load_toy():
    from orchard_async.recipes.toy import load_tasks

    return load_tasks("builtin")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo", "--adapter", "nosuch"], "unknown adapter 'nosuch'"),
        (["run", "--policy", "clever", "--out", "x.jsonl"], "unknown policy 'clever'"),
        (["run", "--episodes", "5", "--group-size", "2", "--out", "x.jsonl"], "multiple of the group size"),
        (["run", "--out", "x.csv"], ".jsonl or .msgpack"),
        (["inspect", "missing.jsonl"], "no such file"),
        (["demo", "--adapter", "sim", "--adapter-options", "{bad json"], "not valid JSON"),
    ],
)
def test_bad_input_is_a_clear_error_that_changes_nothing(
    tmp_path: Path, local_env: dict, args: list[str], message: str
) -> None:
    done = cli(*args, cwd=tmp_path, env=local_env)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "x.csv").exists()


def test_doctor_reports_adapters_and_isolation(tmp_path: Path) -> None:
    done = cli("doctor", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for word in ("local", "sim", "docker", "kubernetes", "namespaces", "network", "event loop", "forks:"):
        assert word in done.stdout


def test_reap_prints_what_it_removed(tmp_path: Path, local_env: dict) -> None:
    root = Path(local_env["ORCHARD_LOCAL_ROOT"])
    stale = root / "lo-stale"
    (stale / "work").mkdir(parents=True)
    (stale / "lease.json").write_text(json.dumps({"id": "lo-stale", "labels": {}, "expires_at": 0}))
    done = cli("reap", cwd=tmp_path, env=local_env)
    assert done.returncode == 0 and "removed lo-stale" in done.stdout
    assert not stale.exists()


def test_bench_exec_json_schema(tmp_path: Path, local_env: dict) -> None:
    done = cli(
        "bench",
        "exec",
        "--adapter",
        "local",
        "--concurrency",
        "1,4",
        "--ops",
        "40",
        "--json",
        "b.json",
        cwd=tmp_path,
        env=local_env,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["scenario"] == "exec" and result["adapter"] == "local" and result["machine"]["cores"]
    subjects = {(row["subject"], row["concurrency"]) for row in result["rows"]}
    assert subjects == {("local", 1), ("floor:spawn", 1), ("local", 4), ("floor:spawn", 4)}
    for row in result["rows"]:
        assert row["ops"] >= 40 and 0 < row["p50_ms"] <= row["p99_ms"] and row["ops_per_s"] > 0


@pytest.mark.soak  # 20-40 s of a worker: the soak run keeps the default under 5 minutes
def test_ctrl_c_destroys_every_sandbox_and_resume_finishes(tmp_path: Path, local_env: dict) -> None:
    import signal
    import time

    out = tmp_path / "big.jsonl"
    args = [
        sys.executable,
        "-m",
        "orchard_async.apps.cli",
        "run",
        "--episodes",
        "150",
        "--concurrency",
        "8",
        "--out",
        str(out),
    ]
    process = subprocess.Popen(
        args, cwd=tmp_path, env=local_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not (out.exists() and out.read_bytes().count(b"\n") >= 1 + 10):  # the run header, then 10 episodes
        assert time.monotonic() < deadline and process.poll() is None, "the run never got going"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130 and "interrupted" in stderr, stderr
    root = Path(local_env["ORCHARD_LOCAL_ROOT"])
    assert not any(root.iterdir()), "a sandbox dir survived Ctrl-C"
    assert not [d for d in _sandbox_processes() if Path(d).parent == root]
    partial = {t.episode_id for t in oa.read_trajectories(out, strict=True)}
    assert 10 <= len(partial) < 150

    resumed = cli(
        "run", "--episodes", "150", "--concurrency", "8", "--out", str(out), "--resume", cwd=tmp_path, env=local_env
    )
    assert resumed.returncode == 0, resumed.stderr
    final = [t.episode_id for t in oa.read_trajectories(out, strict=True)]
    assert len(final) == 150 and len(set(final)) == 150 and partial <= set(final)


def test_the_summary_shows_verifier_errors_and_model_outages_in_red() -> None:
    from rich.console import Console

    from orchard_async.apps.cli import print_summary
    from orchard_async.records.summary import summarize

    def ended(reason: str, index: int) -> oa.Trajectory:
        status = "finished" if reason == "submitted" else "failed"
        return oa.Trajectory(
            episode_id=f"e{index}", task_id="t", group_id="g", sample=0, policy="p", adapter="sim", run_id="r",
            status=status, end_reason=reason, success=status == "finished",
        )  # fmt: skip

    def row(summary, label: str) -> tuple[list[str], str]:
        """The row's cells as text, and the row as printed (with its colour codes)."""
        screen = Console(record=True, force_terminal=True, color_system="standard", width=120)
        print_summary(summary, "t", screen)
        styled = [line for line in screen.export_text(styles=True, clear=False).splitlines() if label in line]
        plain = [line for line in screen.export_text().splitlines() if label in line]
        assert len(plain) == len(styled) == 1
        return plain[0].replace("│", " ").split(), styled[0]

    red = "\x1b[31m"
    reasons = ["submitted", "verifier_error", "verifier_error", "model_unavailable"]
    broken = summarize([ended(reason, i) for i, reason in enumerate(reasons)])
    cells, styled = row(broken, "verifier errors")
    assert cells == ["verifier", "errors", "2"] and red in styled
    cells, styled = row(broken, "model unavailable")
    assert cells == ["model", "unavailable", "1"] and red in styled
    clean = summarize([ended("submitted", 0)])
    cells, styled = row(clean, "verifier errors")
    assert cells == ["verifier", "errors", "0"] and red not in styled

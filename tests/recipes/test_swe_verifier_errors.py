"""A verifier that cannot judge is never a reward (issue: a fresh install scored the oracle 0%).

When the test runner is missing or broken, episodes end as ``verifier_error``, are retried,
are counted in ``inspect --json`` and never reach an export; the harness proof at setup
catches it before the agent spends a step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from orchard_async.recipes import swe
from orchard_async.recipes.swe.builtin import INSTANCES_PATH
from tests.recipes.swe_support import ScriptPolicy, run_rollout

BUILTIN = {row["instance_id"]: row for row in map(json.loads, INSTANCES_PATH.read_text().splitlines()) if row}

BROKEN_RUNNERS = {
    "runner_not_found": "no-such-test-runner -rA",  # exit 127
    "module_missing": "python -m no_such_pytest_module -rA",  # Python's exit 1, nothing ran
    "usage_error": "python -m pytest -rA --no-such-option",  # pytest's exit 4
}


def instances_file(tmp_path: Path, test_command: str) -> Path:
    rows = [dict(BUILTIN[i], test_command=test_command) for i in ("minicalc__1", "textkit__1")]
    path = tmp_path / "instances.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORCHARD_LOCAL_ROOT": str(cwd / "sandboxes")}
    return subprocess.run(
        [sys.executable, "-m", "orchard_async.apps.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("runner", sorted(BROKEN_RUNNERS))
def test_a_broken_test_runner_is_a_verifier_error_not_a_reward(runner, tmp_path):
    tasks = swe.load_tasks(str(instances_file(tmp_path, BROKEN_RUNNERS[runner])))
    run = anyio.run(lambda: run_rollout(tasks, swe.make_policy("oracle"), tmp_path / "root"))
    for trajectory in run.trajectories:
        assert (trajectory.status, trajectory.end_reason) == ("failed", "verifier_error"), trajectory.error
        assert trajectory.reward == 0.0 and not trajectory.success
        assert [r.reason for r in trajectory.retries] == ["verifier_error"] * 3  # retried, then given up
        assert trajectory.steps == []  # caught by the harness proof before the agent acted
    assert run.leaked == [] and run.left_on_disk == []


def test_verifier_errors_are_flagged_in_inspect_and_absent_from_exports(tmp_path):
    broken = instances_file(tmp_path, BROKEN_RUNNERS["runner_not_found"])
    out = tmp_path / "run.jsonl"
    done = cli(
        "run",
        "swe",
        "--tasks",
        str(broken),
        "--policy",
        "oracle",
        "--episodes",
        "2",
        "--max-retries",
        "1",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert done.returncode == 1 and "0 of 2 episodes were judged" in done.stderr, done.stderr  # nothing judged
    summary = json.loads(cli("inspect", str(out), "--json", cwd=tmp_path).stdout)
    assert summary["verifier_errors"] == 2 and summary["exit_reasons"] == {"verifier_error": 2}
    assert summary["judged"] == 0 and summary["success_rate"] is None  # no rate over episodes nobody judged
    for fmt in ("sft", "grpo"):
        exported = tmp_path / f"{fmt}.jsonl"
        done = cli("export", fmt, str(out), "--out", str(exported), cwd=tmp_path)
        assert done.returncode == 1 and "no records to export" in done.stderr, done.stderr
        assert "verifier_error 2" in done.stderr and not exported.exists(), f"{fmt} exported a verifier error"


@pytest.mark.soak  # whole SWE episodes whose scorer crashes: about 16 s
def test_a_verifier_that_crashes_after_the_proof_is_a_verifier_error(tmp_path):
    """The proof passed, then grading broke with nothing of the agent's in the tree: the
    verifier's fault. (A patch that breaks the harness is the agent's: reward 0, flagged.)"""
    (task,) = swe.load_tasks("builtin:minicalc__1")

    class BreaksAfterProof(swe.SWETask):
        @property
        def test_command(self) -> str:
            proven = bool(self.proofs.proven)
            return "exit 127" if proven else super().test_command

    broken = BreaksAfterProof(
        task.instance, task.source, task.spec, deadline=task.deadline, score_timeout=task.score_timeout
    )
    run = anyio.run(lambda: run_rollout([broken], swe.make_policy("empty"), tmp_path / "root"))
    (trajectory,) = run.trajectories
    assert trajectory.end_reason == "verifier_error" and "not found" in trajectory.error

    harmful = "cat > minicalc/__init__.py <<'EOF'\nraise ImportError('the agent broke the package')\nEOF"
    run = anyio.run(lambda: run_rollout([task], ScriptPolicy([harmful]), tmp_path / "r2"))
    (trajectory,) = run.trajectories
    assert (trajectory.status, trajectory.reward) == ("finished", 0.0), trajectory.error
    assert trajectory.info["harness_broken_by_patch"]

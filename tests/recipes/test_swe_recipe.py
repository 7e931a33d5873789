"""The bundled SWE set validated *through the recipe* on the local adapter, the way SWE-bench
validates instances: the gold patch (oracle policy, applied by shell commands) resolves every
instance with every FAIL_TO_PASS and PASS_TO_PASS test passing; submitting nothing (empty
policy) resolves none, every FAIL_TO_PASS test failing (reported, not missing) while every
PASS_TO_PASS test passes. Both runs leave no sandbox behind."""

from __future__ import annotations

import anyio
import pytest

from orchard_async.recipes import swe
from tests.recipes.swe_support import ScriptPolicy, run_rollout

TASKS = swe.load_tasks("builtin")
IDS = [task.id for task in TASKS]


def test_runs_leave_nothing_behind(builtin_validation):
    for name, run in builtin_validation.items():
        assert len(run.trajectories) == len(TASKS), name
        assert run.leaked == [] and run.left_on_disk == [], (name, run.leaked, run.left_on_disk)
        assert all(t.status == "finished" and t.end_reason == "submitted" for t in run.trajectories), name
        assert all(set(t.timings) >= {"setup", "agent", "score"} for t in run.trajectories)


@pytest.mark.parametrize("instance_id", IDS)
def test_gold_resolves(builtin_validation, instance_id):
    trajectory = builtin_validation["oracle"].by_task()[instance_id]
    info = trajectory.info
    assert trajectory.success and trajectory.reward == 1.0, info.get("test_output_tail", info)
    assert info["resolved"] is True and not info["empty_patch"]
    assert set(info["tests"].values()) == {"PASSED"}
    task = next(t for t in TASKS if t.id == instance_id)
    assert len(info["tests"]) == len(task.instance.FAIL_TO_PASS) + len(task.instance.PASS_TO_PASS)
    # the patch scored is the working tree's diff: the gold patch's files, nothing else
    assert swe.instances.patch_files(info["patch"]) == swe.instances.patch_files(task.instance.patch)


@pytest.mark.parametrize("instance_id", IDS)
def test_empty_resolves_none_and_f2p_fails_before(builtin_validation, instance_id):
    trajectory = builtin_validation["empty"].by_task()[instance_id]
    info = trajectory.info
    task = next(t for t in TASKS if t.id == instance_id)
    assert not trajectory.success and trajectory.reward == 0.0
    assert info["resolved"] is False and info["empty_patch"] is True and info["patch"] == ""
    f2p = {test: info["tests"][test] for test in task.instance.FAIL_TO_PASS}
    assert all(status in ("FAILED", "ERROR") for status in f2p.values()), f2p
    assert info["tests_status"]["FAIL_TO_PASS"]["success"] == []
    assert info["tests_status"]["PASS_TO_PASS"]["failure"] == [], info.get("test_output_tail")


def test_hidden_tests_are_restored_before_scoring(tmp_path):
    """An agent that rewrites the tests the test patch touches cannot game the verifier: those
    files go back to base before the test patch is applied. An agent that breaks the
    repository scores 0 (its own failure, not the task's)."""
    tasks = swe.load_tasks("builtin:textkit__1,datespan__1,minicalc__5")
    gold = {task.id: swe.policies.gold_patch_command(task.instance.patch) for task in tasks}
    commands = {
        # the fix, plus a vandalised test file that the test patch touches
        "textkit__1": [gold["textkit__1"], "echo 'def test_nothing(): pass' > tests/test_slug.py"],
        # no fix, but the hidden tests' file replaced by one that passes trivially
        "datespan__1": ["printf 'def test_spans_sharing_one_day_overlap():\\n    pass\\n' > tests/test_span.py"],
        # a repository the agent broke beyond diffing: scored 0, not a task error
        "minicalc__5": ["rm -rf .git"],
    }
    run = anyio.run(run_rollout, tasks, ScriptPolicy(commands), tmp_path / "sbx")
    by_task = run.by_task()
    assert by_task["textkit__1"].success, by_task["textkit__1"].info.get("test_output_tail")
    assert "tests/test_slug.py" in by_task["textkit__1"].info["patch"]  # recorded as the agent made it
    fooled = by_task["datespan__1"]
    assert not fooled.success
    assert fooled.info["tests"]["tests/test_span.py::test_spans_sharing_one_day_overlap"] == "FAILED"
    broken = by_task["minicalc__5"]
    assert broken.status == "finished" and not broken.success and broken.info["error"] == "no diff"
    assert run.leaked == [] and run.left_on_disk == []

"""Validate the bundled SWE-style task set the way SWE-bench validates instances.

For every instance in ``recipes/swe/builtin/instances.jsonl``:

1. ``base_commit`` equals the hash produced by ``make_repo.materialize()``;
2. at base + ``test_patch`` every FAIL_TO_PASS test fails and every
   PASS_TO_PASS test passes;
3. at base + ``test_patch`` + gold ``patch`` all of them pass;
4. ``patch`` touches no test file and ``test_patch`` touches only test files.

Checks 1 and 4 (and the schema) use only subprocess and git, with ``make_repo``
imported by file path. Checks 2 and 3 run the suites through the SWE recipe on
the local adapter (the ``builtin_validation`` session fixture in conftest.py:
the ``empty`` policy gives base + test_patch, the ``oracle`` policy base + gold
+ test_patch), so each suite runs once per session for this file and
``test_swe_recipe.py`` together. For a check that shares no code with the
recipe but its reader of pytest's ``-rA`` summary (``pytest_summary``), ``python -m
orchard_async.recipes.swe.builtin.generator --check`` rebuilds every instance with plain
subprocesses and compares byte for byte.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import subprocess

import pytest

BUILTIN_DIR = pathlib.Path(__file__).resolve().parents[2] / "recipes" / "swe" / "builtin"
INSTANCES_PATH = BUILTIN_DIR / "instances.jsonl"
REQUIRED_KEYS = {
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "test_command",
    "created_at",
}


def _load_make_repo():
    spec = importlib.util.spec_from_file_location("_swe_builtin_make_repo", BUILTIN_DIR / "make_repo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_repo = _load_make_repo()


def _load_instances():
    with open(INSTANCES_PATH, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


INSTANCES = _load_instances()
INSTANCE_IDS = [inst["instance_id"] for inst in INSTANCES]
BY_ID = {inst["instance_id"]: inst for inst in INSTANCES}


# -- helpers ---------------------------------------------------------------

_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def patched_files(patch: str) -> set[str]:
    files = set()
    for old, new in _DIFF_HEADER.findall(patch):
        files.update({old, new})
    return files


def is_test_file(path: str) -> bool:
    parts = path.split("/")
    name = parts[-1]
    return (
        any(part in ("tests", "test", "testing") for part in parts[:-1])
        or name.startswith("test_")
        or name.endswith("_test.py")
        or name == "conftest.py"
    )


def run_git(args: list[str], cwd: pathlib.Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args],
        cwd=str(cwd),
        input=stdin,
        env=make_repo.git_env(),
        capture_output=True,
        text=True,
    )


def _tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


# -- tests -----------------------------------------------------------------


def test_instances_schema():
    assert len(INSTANCES) >= 12
    assert len(set(INSTANCE_IDS)) == len(INSTANCE_IDS), "duplicate instance ids"
    repos = set(make_repo.repo_names())
    for inst in INSTANCES:
        iid = inst["instance_id"]
        assert set(inst) == REQUIRED_KEYS, iid
        assert inst["repo"] in repos, iid
        assert re.fullmatch(rf"{re.escape(inst['repo'])}__\d+", iid), iid
        assert re.fullmatch(r"[0-9a-f]{40}", inst["base_commit"]), iid
        assert inst["problem_statement"].strip(), iid
        assert inst["created_at"] == "2026-12-02", iid
        assert inst["test_command"].split()[:3] == ["python", "-m", "pytest"], iid
        assert "-rA" in inst["test_command"].split(), iid
        f2p, p2p = inst["FAIL_TO_PASS"], inst["PASS_TO_PASS"]
        assert f2p and p2p, iid
        assert all(isinstance(t, str) and "::" in t and " " not in t for t in f2p + p2p), iid
        assert len(set(f2p)) == len(f2p) and len(set(p2p)) == len(p2p), iid
        assert not set(f2p) & set(p2p), iid
        # the statement must not leak the fix
        assert "diff --git" not in inst["problem_statement"], iid
    # at least three repositories, none of them trivial
    assert len({inst["repo"] for inst in INSTANCES}) >= 3


@pytest.mark.parametrize("instance_id", INSTANCE_IDS)
def test_patch_file_partition(instance_id):
    inst = BY_ID[instance_id]
    gold_files = patched_files(inst["patch"])
    test_files = patched_files(inst["test_patch"])
    assert gold_files, "gold patch is empty"
    assert test_files, "test patch is empty"
    assert not [f for f in gold_files if is_test_file(f)], f"gold patch touches tests: {sorted(gold_files)}"
    assert all(is_test_file(f) for f in test_files), f"test patch touches non-tests: {sorted(test_files)}"
    # every FAIL_TO_PASS test lives in a file that the test patch touches
    for nodeid in inst["FAIL_TO_PASS"]:
        assert nodeid.split("::", 1)[0] in test_files, nodeid


@pytest.mark.parametrize("repo_name", sorted({inst["repo"] for inst in INSTANCES}))
def test_materialize_is_deterministic(repo_name, tmp_path):
    first = make_repo.materialize(repo_name, tmp_path / "a")
    second = make_repo.materialize(repo_name, tmp_path / "b")
    assert first == second
    status = run_git(["status", "--porcelain", "--untracked-files=all"], tmp_path / "a")
    assert status.returncode == 0 and status.stdout == "", status.stdout
    for inst in INSTANCES:
        if inst["repo"] == repo_name:
            assert inst["base_commit"] == first, inst["instance_id"]


@pytest.mark.parametrize("instance_id", INSTANCE_IDS)
def test_instance_validates(instance_id, builtin_validation):
    inst = BY_ID[instance_id]
    f2p, p2p = inst["FAIL_TO_PASS"], inst["PASS_TO_PASS"]
    before = builtin_validation["empty"].by_task()[instance_id]
    after = builtin_validation["oracle"].by_task()[instance_id]

    # (1) reproducible base commit: the recipe checks it out from the materialized tree
    assert before.status == "finished" and after.status == "finished", (before.error, after.error)

    # (2) base + test_patch: FAIL_TO_PASS fail, PASS_TO_PASS pass
    log_before = before.info.get("test_output_tail", "")
    assert "error" not in before.info, f"test_patch does not apply:\n{before.info.get('detail')}"
    passed_too_early = [t for t in f2p if before.info["tests"][t] == "PASSED"]
    assert not passed_too_early, f"FAIL_TO_PASS passing before the fix: {passed_too_early}\n{_tail(log_before)}"
    # the FAIL_TO_PASS tests must actually run and fail, not just be missing
    missing = [t for t in f2p if before.info["tests"][t] == "MISSING"]
    assert not missing, f"FAIL_TO_PASS tests not collected: {missing}\n{_tail(log_before)}"
    broken = [t for t in p2p if before.info["tests"][t] != "PASSED"]
    assert not broken, f"PASS_TO_PASS not passing before the fix: {broken}\n{_tail(log_before)}"

    # (3) base + test_patch + gold patch: everything passes
    apply_step = after.steps[0]
    assert apply_step.exit_code == 0, f"gold patch does not apply:\n{apply_step.observation}"
    not_passing = [t for t in f2p + p2p if after.info["tests"][t] != "PASSED"]
    assert not not_passing, (
        f"not passing with the gold patch: {not_passing}\n{_tail(after.info.get('test_output_tail', ''))}"
    )

"""Generate ``instances.jsonl`` for the bundled SWE task set.

Each task in ``tasks_<repo>.py`` names its repository, an issue-style problem
statement, the edits of the gold fix (``gold``), the edits adding tests
(``tests``) and the FAIL_TO_PASS tests it expects. For every task this tool
materializes the repository at its base commit (``make_repo.materialize``),
turns the edits into ``test_patch`` and ``patch``, runs the suite with the test
patch and again with the gold patch, derives FAIL_TO_PASS / PASS_TO_PASS from
the per-test outcomes, checks them against the task's expectation, and writes
one instance per line.

Paths are relative to this file, so it runs from any directory::

    python -m orchard_async.recipes.swe.builtin.generator            # rewrite ../instances.jsonl
    python -m orchard_async.recipes.swe.builtin.generator --check    # regenerate and compare
    python recipes/swe/builtin/generator/gen.py --out /tmp/x.jsonl   # same, as a script

The output is a pure function of the base trees and the task definitions
(pinned commit identity, sorted test ids), so ``--check`` on an unchanged tree
reproduces the committed file byte for byte.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from types import ModuleType

HERE = pathlib.Path(__file__).resolve().parent
BUILTIN = HERE.parent
INSTANCES_PATH = BUILTIN / "instances.jsonl"
TASK_MODULES = ("tasks_minicalc", "tasks_textkit", "tasks_datespan")  # order fixes the instance ids

TEST_COMMAND = "python -m pytest -rA -p no:cacheprovider"
CREATED_AT = "2026-12-02"


def _load(name: str, path: pathlib.Path) -> ModuleType:
    """Import a file by path, so this works both as ``python -m`` and as a script."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_repo = _load("_swe_builtin_make_repo", BUILTIN / "make_repo.py")
pytest_summary = _load("_swe_pytest_summary", BUILTIN.parent / "pytest_summary.py")


def load_task_definitions() -> list[dict]:
    tasks: list[dict] = []
    for name in TASK_MODULES:
        tasks += _load(f"_swe_builtin_{name}", HERE / f"{name}.py").TASKS
    return tasks


def outcomes(cwd: pathlib.Path) -> tuple[dict[str, str], str]:
    """Node id -> status from the ``-rA`` short summary, read as the recipe's scorer reads it."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", COLUMNS="200")
    env.pop("PYTEST_ADDOPTS", None)
    argv = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider"]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    return pytest_summary.parse_test_outcomes(proc.stdout), proc.stdout


def apply_edits(root: pathlib.Path, edits: list[tuple]) -> None:
    """``("append", path, text)`` or ``("replace", path, old, new)``; ``old`` must occur once."""
    for edit in edits:
        kind, path = edit[0], root / edit[1]
        text = path.read_text() if path.exists() else ""
        if kind == "append":
            text = text + edit[2]
        elif kind == "replace":
            assert text.count(edit[2]) == 1, (edit[1], edit[2])
            text = text.replace(edit[2], edit[3])
        else:
            raise ValueError(f"unknown edit kind {kind!r} for {edit[1]}")
        path.write_text(text)


def diff_of(root: pathlib.Path) -> str:
    """The working tree's changes as a full-index diff; the tree is reset to HEAD afterwards."""
    make_repo.git(["add", "-A"], root)
    diff = make_repo.git(["diff", "--cached", "--no-color", "--no-ext-diff", "--full-index"], root).stdout
    make_repo.git(["reset", "-q", "--hard"], root)
    return diff


def files_in(patch: str) -> list[str]:
    return re.findall(r"^diff --git a/(\S+) b/", patch, re.M)


def is_test(path: str) -> bool:
    parts = path.split("/")
    return "tests" in parts[:-1] or parts[-1].startswith("test_") or parts[-1] == "conftest.py"


def git_apply(root: pathlib.Path, patch: str) -> None:
    subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=root, env=make_repo.git_env(), check=True)


class GenerationError(Exception):
    pass


def build_instance(task: dict, iid: str, workdir: pathlib.Path) -> dict:
    repo = task["repo"]
    root = workdir / iid
    base = make_repo.materialize(repo, root)
    apply_edits(root, task["tests"])
    test_patch = diff_of(root)
    apply_edits(root, task["gold"])
    patch = diff_of(root)
    if not all(is_test(f) for f in files_in(test_patch)) or any(is_test(f) for f in files_in(patch)):
        raise GenerationError(f"{iid}: the gold patch must touch no test file and the test patch only test files")
    git_apply(root, test_patch)  # base + test_patch: F2P must fail
    before, _ = outcomes(root)
    git_apply(root, patch)  # + gold patch: everything must pass
    after, out_after = outcomes(root)
    failing = sorted(k for k, v in after.items() if v != "PASSED")
    if failing:
        raise GenerationError(f"{iid}: not passing with the gold patch: {failing}\n{out_after[-3000:]}")
    if set(before) != set(after):
        raise GenerationError(f"{iid}: different tests collected before/after: {sorted(set(before) ^ set(after))}")
    f2p = sorted(k for k, v in before.items() if v != "PASSED" and after.get(k) == "PASSED")
    p2p = sorted(k for k, v in before.items() if v == "PASSED" and after.get(k) == "PASSED")
    if sorted(task["expect_f2p"]) != f2p:
        raise GenerationError(f"{iid}: FAIL_TO_PASS mismatch: expected {sorted(task['expect_f2p'])}, got {f2p}")
    shutil.rmtree(root)
    return {
        "instance_id": iid,
        "repo": repo,
        "base_commit": base,
        "problem_statement": task["problem_statement"],
        "patch": patch,
        "test_patch": test_patch,
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "test_command": TEST_COMMAND,
        "created_at": CREATED_AT,
    }


def generate(jobs: int = 1) -> list[dict]:
    """Every instance, in task order (ids ``<repo>__<n>`` count per repo)."""
    counters: dict[str, int] = {}
    named = []
    for task in load_task_definitions():
        counters[task["repo"]] = counters.get(task["repo"], 0) + 1
        named.append((task, f"{task['repo']}__{counters[task['repo']]}"))
    with tempfile.TemporaryDirectory(prefix="swegen-") as tmp:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [pool.submit(build_instance, task, iid, pathlib.Path(tmp)) for task, iid in named]
            instances = [future.result() for future in futures]
    hashes = {}
    for inst in instances:
        if hashes.setdefault(inst["repo"], inst["base_commit"]) != inst["base_commit"]:
            raise GenerationError(f"{inst['instance_id']}: base commit differs between tasks of {inst['repo']}")
    return instances


def render(instances: list[dict]) -> str:
    return "".join(json.dumps(inst, ensure_ascii=False) + "\n" for inst in instances)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", type=pathlib.Path, default=INSTANCES_PATH, help=f"output file (default {INSTANCES_PATH})"
    )
    parser.add_argument("--check", action="store_true", help="regenerate and compare with --out instead of writing it")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="instances built in parallel")
    args = parser.parse_args(argv)
    try:
        instances = generate(args.jobs)
    except GenerationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for inst in instances:
        print(inst["instance_id"], "F2P", len(inst["FAIL_TO_PASS"]), "P2P", len(inst["PASS_TO_PASS"]))
    text = render(instances)
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} differs from what the generator produces; rerun without --check", file=sys.stderr)
            return 1
        print(f"{args.out}: up to date ({len(instances)} instances)")
        return 0
    args.out.write_text(text, encoding="utf-8")
    print("wrote", len(instances), "instances to", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

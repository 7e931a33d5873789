"""Official-harness parity, through the official ``swebench`` package (the optional extra).

* The bundled tasks graded both ways: the recipe run with SWE-bench's evaluation fields
  (swebench's test spec, its eval script, its log parser and ``get_eval_report``) gives the
  same verdicts and per-test statuses as the recipe's own pytest harness, gold and empty
  patches alike; and on each very test log swebench judged, the recipe's own parser and
  ``grade()`` agree with swebench's ``get_logs_eval`` / ``get_eval_report``.
* Test ids with spaces, from a real pytest run, graded by both.
* SWE-bench's image names: the recipe's convention equals swebench's ``ImageSpec.name``.

Skipped without swebench>=5 (``pip install 'orchard-async[swebench]'``).
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
from orchard_async.recipes.swe import scoring
from orchard_async.recipes.swe import swebench_harness as official
from tests.recipes.swe_support import run_rollout, side_by_side
from tests.recipes.swebench_rows import BUILTIN, official_row

if not official.usable():
    # .ci/run installs the swebench extra: in CI its absence is a failure, not a skip.
    reason = (
        f"swebench>={official.MIN_VERSION} is not installed (found {official.installed_version()}): "
        "pip install 'orchard-async[swebench]'"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason, allow_module_level=True)

from swebench.harness.grading import get_eval_report, get_logs_eval  # noqa: E402
from swebench.image_builder.image_spec import ImageSpec  # noqa: E402

IDS = [row["instance_id"] for row in BUILTIN]


def write_rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def swebench_verdict(task: swe.SWETask, log: str, patch: str, tmp: Path) -> dict:
    """swebench's own functions on ``log``, written as its harness writes test_output.txt."""
    path = tmp / f"{task.id}.test_output.txt"
    path.write_text(log)
    spec = task.official.test_spec
    status_map, found = get_logs_eval(spec, str(path))
    prediction = {"instance_id": task.id, "model_name_or_path": "parity", "model_patch": patch}
    report = get_eval_report(spec, prediction, str(path), include_tests_status=True)[task.id]
    return {"status_map": status_map, "found": found, **report}


def recipe_verdict(task: swe.SWETask, log: str) -> dict:
    """The recipe's own parser and grade() on the test output inside swebench's markers."""
    inside = log.split(official.START_MARK, 1)[1].split(official.END_MARK, 1)[0]
    return scoring.grade(task.instance, scoring.parse_test_outcomes(inside))


@pytest.fixture(scope="module")
def official_runs(tmp_path_factory) -> dict:
    """The bundled set through the recipe with SWE-bench's evaluation fields on local, gold
    and empty, with every log swebench judged kept (instance id, log, patch)."""
    tmp = tmp_path_factory.mktemp("swe-parity")
    rows = [official_row(row, conda=False, global_git_config=False) for row in BUILTIN]
    tasks = swe.load_tasks(write_rows(tmp / "official.jsonl", rows), harness="swebench")
    judged: list[tuple[str, str, str]] = []
    judge = official.OfficialHarness.judge

    def keep(self, log: str, patch: str):
        judged.append((self.instance.instance_id, log, patch))
        return judge(self, log, patch)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(official.OfficialHarness, "judge", keep)

        async def both() -> dict:
            return await side_by_side(
                oracle=lambda: run_rollout(tasks, swe.make_policy("oracle"), tmp / "oracle"),
                empty=lambda: run_rollout(tasks, swe.make_policy("empty"), tmp / "empty"),
            )

        runs = anyio.run(both)
    return {"tasks": {t.id: t for t in tasks}, "runs": runs, "judged": judged, "tmp": tmp}


@pytest.mark.soak  # the bundled set twice more through the official harness (~25 s); CI runs soak
def test_the_official_rows_are_graded_by_swebench(official_runs):
    tasks = official_runs["tasks"]
    assert all(isinstance(task.harness, scoring.OfficialTests) for task in tasks.values())
    for name, run in official_runs["runs"].items():
        assert run.leaked == [] and run.left_on_disk == [], name
        for trajectory in run.trajectories:
            assert trajectory.status == "finished", (name, trajectory.task_id, trajectory.error)
            assert trajectory.info["harness"] == "swebench"
            assert trajectory.success == (name == "oracle"), (name, trajectory.info.get("test_output_tail"))
    # one proof per environment (at setup) and one grading per episode, every one judged by swebench
    graded = [tid for tid, _, _ in official_runs["judged"]]
    assert sorted(set(graded)) == sorted(IDS)
    assert len(graded) >= 2 * len(IDS)


@pytest.mark.parametrize("policy", ["oracle", "empty"])
@pytest.mark.soak  # the bundled set twice more through the official harness (~25 s); CI runs soak
def test_same_verdicts_and_statuses_as_the_recipes_own_harness(official_runs, builtin_validation, policy):
    ours = builtin_validation[policy].by_task()
    theirs = official_runs["runs"][policy].by_task()
    for instance_id in IDS:
        mine, swebench = ours[instance_id].info, theirs[instance_id].info
        assert mine["harness"] == "pytest" and swebench["harness"] == "swebench"
        assert mine["resolved"] == swebench["resolved"], instance_id
        assert mine["tests"] == swebench["tests"], instance_id
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            assert mine["tests_status"][key] == swebench["tests_status"][key], (instance_id, key)


@pytest.mark.soak  # the bundled set twice more through the official harness (~25 s); CI runs soak
def test_each_log_graded_both_ways_on_the_same_file(official_runs):
    tasks, tmp = official_runs["tasks"], official_runs["tmp"]
    verdicts = {True: 0, False: 0}
    for instance_id, log, patch in official_runs["judged"]:
        task = tasks[instance_id]
        theirs = swebench_verdict(task, log, patch, tmp)
        ours = recipe_verdict(task, log)
        assert theirs["found"] and theirs["patch_successfully_applied"], instance_id
        assert ours["resolved"] == theirs["resolved"], instance_id
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            assert ours["tests_status"][key] == theirs["tests_status"][key], (instance_id, key)
        statuses = {test: task.official.status_of(test, theirs["status_map"]) for test in ours["tests"]}
        assert ours["tests"] == statuses, instance_id
        assert f"{official.EXIT_CODE_MARK}: " in log  # the exit code swebench cross-checks was recorded
        verdicts[ours["resolved"]] += 1
    assert verdicts[True] >= len(IDS) and verdicts[False] >= len(IDS)  # gold, and empty + the proofs


def test_ids_with_spaces_graded_as_swebench_grades_them(tmp_path):
    """A real pytest run whose node ids have spaces; the instance lists them as SWE-bench's
    datasets do, cut at the first space. Both graders agree, test by test."""
    (tmp_path / "test_words.py").write_text(
        "import pytest\n\n\n"
        '@pytest.mark.parametrize("text", ["a b", "c d e", "x"])\n'
        "def test_upper(text):\n"
        '    assert text.upper() != "C D E"\n\n\n'
        '@pytest.mark.parametrize("text", ["p q", "p r"])\n'
        "def test_pair(text):\n"
        '    assert text != "p r"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "test_words.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )
    assert done.returncode == 1, done.stdout
    log = f"+ : '{official.START_MARK}'\n{done.stdout}+ : '{official.END_MARK}'\n{official.EXIT_CODE_MARK}: 1\n"
    row = dict(
        BUILTIN[0],
        instance_id="spaces__1",
        FAIL_TO_PASS=["test_words.py::test_upper[a", "test_words.py::test_upper[c", "test_words.py::test_pair[p"],
        PASS_TO_PASS=["test_words.py::test_upper[x]"],
    )
    (task,) = swe.load_tasks(
        write_rows(tmp_path / "spaces.jsonl", [official_row(row, conda=False)]), harness="swebench"
    )
    theirs = swebench_verdict(task, log, "x", tmp_path)
    ours = recipe_verdict(task, log)
    assert ours["tests"] == {
        "test_words.py::test_upper[a": "PASSED",
        "test_words.py::test_upper[c": "FAILED",
        "test_words.py::test_pair[p": "FAILED",  # "p q" passed, "p r" failed: the later line, as swebench keeps it
        "test_words.py::test_upper[x]": "PASSED",
    }
    assert ours["tests"] == {test: task.official.status_of(test, theirs["status_map"]) for test in ours["tests"]}
    assert ours["tests_status"]["FAIL_TO_PASS"] == theirs["tests_status"]["FAIL_TO_PASS"]
    assert ours["resolved"] is theirs["resolved"] is False


@pytest.mark.parametrize(
    ("instance_id", "namespace", "tag"),
    [
        ("django__django-11099", "swebench", "latest"),
        ("astropy__astropy-12907", "swebench", "v1"),
        ("sympy__sympy-20590", None, "latest"),
        ("Org__Mixed_Case-1", "MyOrg", "latest"),
    ],
)
def test_image_names_follow_swebench(instance_id, namespace, tag):
    theirs = ImageSpec(instance_id=instance_id, dockerfile="-", namespace=namespace, tag=tag).name
    assert official.image_name(instance_id, namespace=namespace, tag=tag) == theirs
    assert official.image_name(instance_id, namespace=namespace, tag=tag, registry="ghcr.io/") == f"ghcr.io/{theirs}"

"""The task format: loading JSON/JSONL instances, errors that name file, line and field, and
preparing a sandbox from a local git checkout or bundle (no later history leaks in)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async.recipes import swe
from orchard_async.recipes.swe.builtin import INSTANCES_PATH
from orchard_async.recipes.swe.repo import ROOT_MESSAGE
from tests.recipes.swe_support import ScriptPolicy, run_rollout

BUILTIN = [json.loads(line) for line in INSTANCES_PATH.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def test_builtin_loads_and_selects():
    tasks = swe.load_tasks("builtin")
    assert len(tasks) == 17 and len({t.instance.repo for t in tasks}) == 3
    assert all(isinstance(t, oa.Task) for t in tasks)
    assert {t.source.kind for t in tasks} == {"builtin"}
    assert [t.id for t in swe.load_tasks("builtin:textkit__2,datespan")] == ["textkit__2"] + [
        f"datespan__{i}" for i in range(1, 6)
    ]
    assert [t.id for t in swe.load_tasks("builtin", ids=["minicalc__3"])] == ["minicalc__3"]
    with pytest.raises(oa.ConfigError, match="no instance or repo named 'nope'"):
        swe.load_tasks("builtin:nope")
    task = swe.load_tasks("builtin:minicalc__1", max_steps=7, exec_timeout=9)[0]
    assert (task.max_steps, task.exec_timeout, task.score_timeout < task.deadline) == (7, 9, True)


def test_policies_by_name(monkeypatch):
    assert swe.make_policy("oracle").name == "oracle" and swe.make_policy("empty").name == "empty"
    monkeypatch.setenv("ORCHARD_MODEL", "m")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    assert swe.make_policy("openai").name == "openai:m"
    with pytest.raises(oa.ConfigError, match="choose one of: oracle, empty, openai"):
        swe.make_policy("gpt")


def test_jsonl_and_json_files_with_swe_bench_conventions(tmp_path):
    row = dict(BUILTIN[0], FAIL_TO_PASS=json.dumps(BUILTIN[0]["FAIL_TO_PASS"]), version="1.0", hints_text="")
    tasks = swe.load_tasks(str(write_jsonl(tmp_path / "a.jsonl", ["", row])))
    (task,) = tasks
    assert task.instance.FAIL_TO_PASS == tuple(BUILTIN[0]["FAIL_TO_PASS"])
    assert task.instance.extra == {"created_at": "2026-12-02", "version": "1.0", "hints_text": ""}
    assert task.source.kind == "builtin"  # the repo name matches a bundled repository
    for payload in ([BUILTIN[0], BUILTIN[1]], {"instances": [BUILTIN[0], BUILTIN[1]]}):
        (tmp_path / "b.json").write_text(json.dumps(payload, indent=2))
        assert [t.id for t in swe.load_tasks(str(tmp_path / "b.json"))] == ["minicalc__1", "minicalc__2"]
    assert task.test_command == BUILTIN[0]["test_command"]
    bare = swe.Instance(**{**task.instance.__dict__, "test_command": ""})
    assert (
        bare.default_test_command()
        == "python -m pytest -rA -p no:cacheprovider tests/test_evaluator.py tests/test_parser.py"
    )


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("patch"), "missing required field 'patch'"),
        (lambda r: r.update(FAIL_TO_PASS=[]), "field 'FAIL_TO_PASS' must name at least one test"),
        (lambda r: r.update(FAIL_TO_PASS="not json"), "field 'FAIL_TO_PASS' is a string but not a JSON list"),
        (lambda r: r.update(PASS_TO_PASS=[1, 2]), "field 'PASS_TO_PASS' must be a list of test ids"),
        (lambda r: r.update(PASS_TO_PASS=r["FAIL_TO_PASS"][:1]), "fields 'FAIL_TO_PASS' and 'PASS_TO_PASS' both list"),
        (lambda r: r.update(base_commit="main"), "field 'base_commit' must be a lowercase hex commit id"),
        (lambda r: r.update(problem_statement=" "), "field 'problem_statement' must not be empty"),
        (lambda r: r.update(test_patch="just text"), "field 'test_patch' is not a unified diff"),
        (lambda r: r.update(setup_commands=[1]), "field 'setup_commands' must be a string or a list"),
        (lambda r: r.update(repo_path="does/not/exist"), "field 'repo_path': .* does not exist"),
        (lambda r: r.update(activate=["conda activate x"]), "field 'activate' must be a string"),
    ],
    ids=lambda value: value.split("'")[1] if isinstance(value, str) and "'" in value else None,
)
def test_malformed_instance_names_line_and_field(tmp_path, mutate, message):
    bad = dict(BUILTIN[2])
    mutate(bad)
    path = write_jsonl(tmp_path / "tasks.jsonl", [BUILTIN[0], "", bad])
    with pytest.raises(oa.ConfigError, match=rf"tasks\.jsonl:3: instance 'minicalc__3': {message}"):
        swe.load_tasks(str(path))


def test_malformed_files(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [BUILTIN[0], '{"instance_id": "x",'])
    with pytest.raises(oa.ConfigError, match=r"t\.jsonl:2: invalid JSON"):
        swe.load_tasks(str(path))
    path = write_jsonl(tmp_path / "d.jsonl", [BUILTIN[0], BUILTIN[0]])
    with pytest.raises(
        oa.ConfigError, match=r"d\.jsonl:2: instance 'minicalc__1': duplicate instance_id \(first on line 1\)"
    ):
        swe.load_tasks(str(path))
    path = write_jsonl(tmp_path / "l.jsonl", ["[1, 2]"])
    with pytest.raises(oa.ConfigError, match=r"l\.jsonl:1: an instance must be a JSON object, got list"):
        swe.load_tasks(str(path))
    (tmp_path / "a.json").write_text("[\n" + json.dumps(BUILTIN[0]) + ",\n" + json.dumps({"instance_id": "z"}) + "\n]")
    with pytest.raises(oa.ConfigError, match=r"a\.json:3: instance 'z': missing required fields 'repo', 'base_commit'"):
        swe.load_tasks(str(tmp_path / "a.json"))
    (tmp_path / "s.json").write_text('[\n{"a": 1},\n{oops}\n]')
    with pytest.raises(oa.ConfigError, match=r"s\.json:3: invalid JSON"):
        swe.load_tasks(str(tmp_path / "s.json"))
    with pytest.raises(oa.ConfigError, match="no such task file"):
        swe.load_tasks(str(tmp_path / "missing.jsonl"))
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(oa.ConfigError, match="no instances"):
        swe.load_tasks(str(tmp_path / "e.jsonl"))


def _git(cwd: Path, *args: str, stdin: str | None = None) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(["git", *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_checkout_from_local_git_repo_and_bundle_hides_later_history(tmp_path):
    """A user's repository (a git checkout, or a bundle of it) with the fix committed *after*
    the base: the sandbox gets the base commit and its ancestors only, and the agent the
    base's tree as one commit."""
    repo = tmp_path / "calc"
    (repo / "tests").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base with a bug")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    _git(repo, "commit", "-qam", "the fix (future history)")
    _git(repo, "bundle", "create", "-q", str(tmp_path / "calc.bundle"), "--all")
    test_patch = (
        "diff --git a/tests/test_calc.py b/tests/test_calc.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_calc.py\n"
        "@@ -0,0 +1,5 @@\n+from calc import add\n+\n+\n+def test_add():\n+    assert add(2, 2) == 4\n"
    )
    gold = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
    common = dict(
        repo="me/calc",
        base_commit=base,
        problem_statement="add() subtracts",
        patch=gold,
        test_patch=test_patch,
        FAIL_TO_PASS=["tests/test_calc.py::test_add"],
        PASS_TO_PASS=[],
    )
    rows = [
        dict(common, instance_id="from-dir", repo_path="calc"),
        dict(common, instance_id="from-bundle", repo_path="calc.bundle"),
        dict(common, instance_id="from-image", image="example/calc:latest", repo_path="calc"),  # local ignores images
    ]
    tasks = swe.load_tasks(str(write_jsonl(tmp_path / "mine.jsonl", rows)))
    assert [t.source.kind for t in tasks] == ["git", "bundle", "git"]
    assert tasks[0].test_command == "python -m pytest -rA -p no:cacheprovider tests/test_calc.py"
    look = ScriptPolicy(
        [
            "git log --all --format=%H%n%s && git status --short && cat calc.py",
            # no object of the later history either, reachable or not
            "git cat-file --batch-all-objects --batch | grep -c 'return a + b' || true",
        ]
    )
    run = anyio.run(run_rollout, tasks, look, tmp_path / "sbx")
    assert run.leaked == [] and run.left_on_disk == []
    by_id = {task.id: task for task in tasks}
    for trajectory in run.trajectories:
        assert trajectory.status == "finished", trajectory.error
        root = by_id[trajectory.task_id].agent_base
        assert root is not None and root != base
        expected = f"{root}\n{ROOT_MESSAGE}\ndef add(a, b):\n    return a - b\n"
        assert trajectory.steps[0].observation == expected, trajectory.task_id
        assert trajectory.steps[1].observation.strip() == "0", trajectory.task_id
        assert not trajectory.success and trajectory.info["tests"] == {"tests/test_calc.py::test_add": "FAILED"}
    fixed = anyio.run(run_rollout, tasks[:1], swe.make_policy("oracle"), tmp_path / "sbx2")
    assert fixed.trajectories[0].success, fixed.trajectories[0].info


def test_image_instance_without_a_source_fails_clearly_on_local(tmp_path):
    row = dict(BUILTIN[0], repo="astropy/astropy", image="swebench/sweb.eval.x86_64.astropy:latest")
    (task,) = swe.load_tasks(str(write_jsonl(tmp_path / "img.jsonl", [row])))
    assert task.source is None and task.spec.image == row["image"] and task.spec.workdir == "/testbed"
    run = anyio.run(run_rollout, [task], swe.make_policy("empty"), tmp_path / "sbx")
    (trajectory,) = run.trajectories
    assert trajectory.status == "failed" and trajectory.end_reason == "task_error"
    assert "no repository at its working directory" in trajectory.error and "repo_path" in trajectory.error
    assert run.left_on_disk == []


def test_commit_missing_from_source(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "f").write_text("x\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "one")
    row = dict(BUILTIN[0], repo="r", repo_path="r", base_commit="0" * 40)
    (task,) = swe.load_tasks(str(write_jsonl(tmp_path / "m.jsonl", [row])))
    run = anyio.run(run_rollout, [task], swe.make_policy("empty"), tmp_path / "sbx")
    assert run.trajectories[0].end_reason == "task_error"
    assert f"commit {'0' * 40} is not in git {repo}" in run.trajectories[0].error


def test_generator_definitions_match_the_committed_instances():
    """The generator (``python -m orchard_async.recipes.swe.builtin.generator --check`` rebuilds
    the file byte for byte; too slow for every run) and instances.jsonl agree on what is cheap
    to compare: ids, order, statements, expected FAIL_TO_PASS; and its edits reproduce the patches."""
    from orchard_async.recipes.swe.builtin.generator import gen

    definitions = gen.load_task_definitions()
    assert len(definitions) == len(BUILTIN)
    counters: dict[str, int] = {}
    for task, inst in zip(definitions, BUILTIN, strict=True):
        counters[task["repo"]] = counters.get(task["repo"], 0) + 1
        assert inst["instance_id"] == f"{task['repo']}__{counters[task['repo']]}"
        assert inst["problem_statement"] == task["problem_statement"]
        assert inst["FAIL_TO_PASS"] == sorted(task["expect_f2p"])
        assert inst["test_command"] == gen.TEST_COMMAND and inst["created_at"] == gen.CREATED_AT


def test_generator_edits_reproduce_the_patches(tmp_path):
    from orchard_async.recipes.swe.builtin.generator import gen

    task, inst = gen.load_task_definitions()[6], BUILTIN[6]  # textkit__1
    root = tmp_path / "repo"
    assert gen.make_repo.materialize(task["repo"], root) == inst["base_commit"]
    gen.apply_edits(root, task["tests"])
    assert gen.diff_of(root) == inst["test_patch"]
    gen.apply_edits(root, task["gold"])
    assert gen.diff_of(root) == inst["patch"]


# -- test ids as SWE-bench stores them ------------------------------------------------------


def test_status_of_matches_ids_cut_at_the_first_space_as_swebench_does():
    outcomes = {
        "t.py::test_f[a b]": "PASSED",
        "t.py::test_f[c d e]": "FAILED",
        "t.py::test_g[p q]": "PASSED",
        "t.py::test_g[p r]": "FAILED",  # cuts like the one above: the worse (later in -rA) wins
        "t.py::test_h[long-param-one]": "PASSED",
        "t.py::test_h[long-param-two]": "PASSED",
        "t.py::test_k[x-1]": "PASSED",
        "t.py::test_k[x-2]": "ERROR",
        "t.py::test_plain": "XFAIL",
    }
    status_of = swe.scoring.status_of
    assert status_of("t.py::test_plain", outcomes) == "XFAIL"  # exact
    assert status_of("t.py::test_f[a b]", outcomes) == "PASSED"  # exact, spaces and all
    assert status_of("t.py::test_f[a", outcomes) == "PASSED"  # SWE-bench's cut id
    assert status_of("t.py::test_f[c", outcomes) == "FAILED"
    assert status_of("t.py::test_g[p", outcomes) == "FAILED"
    # an id cut inside its parameters (swebench's truncated ids): a prefix, when all agree
    assert status_of("t.py::test_h[long-param", outcomes) == "PASSED"
    assert status_of("t.py::test_k[x", outcomes) == "MISSING"  # they disagree: no verdict
    assert status_of("t.py::test_f[z", outcomes) == "MISSING"
    assert status_of("t.py::test_plai", outcomes) == "MISSING"  # balanced brackets: exact ids only


def test_a_node_reported_twice_keeps_the_later_section_of_the_summary():
    summary = "\n".join(
        [
            "=========================== short test summary info ============================",
            "PASSED t.py::test_a",
            "ERROR t.py::test_a - RuntimeError: teardown",
            "ERROR t.py::test_b - RuntimeError: teardown",
            "FAILED t.py::test_b - AssertionError",
            "PASSED t.py::test_c",
            "XFAIL t.py::test_c - reason",
        ]
    )
    outcomes = swe.scoring.parse_test_outcomes(summary + "\nPASSED t.py::test_b\n")  # a line after cannot undo it
    assert outcomes == {"t.py::test_a": "ERROR", "t.py::test_b": "FAILED", "t.py::test_c": "XFAIL"}


def small_repo(tmp_path: Path, name: str, files: dict[str, str]) -> tuple[Path, str]:
    repo = tmp_path / name
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    return repo, _git(repo, "rev-parse", "HEAD")


def new_file_patch(path: str, text: str) -> str:
    lines = text.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"


@pytest.mark.soak  # 13-20 s of whole episodes; `pytest -m soak` (CI runs both)
def test_ids_with_spaces_resolve_end_to_end(tmp_path):
    _, base = small_repo(tmp_path, "words", {"words.py": "def shout(text):\n    return text\n"})
    tests = (
        "import pytest\n\nfrom words import shout\n\n\n"
        '@pytest.mark.parametrize("text", ["a b", "hello world", "x"])\n'
        "def test_shout(text):\n    assert shout(text) == text.upper()\n"
    )
    gold = (
        "diff --git a/words.py b/words.py\n--- a/words.py\n+++ b/words.py\n"
        "@@ -1,2 +1,2 @@\n def shout(text):\n-    return text\n+    return text.upper()\n"
    )
    row = dict(
        instance_id="words__1", repo="me/words", repo_path="words", base_commit=base, problem_statement="shout",
        patch=gold, test_patch=new_file_patch("tests/test_words.py", tests), PASS_TO_PASS=[],
        FAIL_TO_PASS=["tests/test_words.py::test_shout[a", "tests/test_words.py::test_shout[hello", "tests/test_words.py::test_shout[x]"],
    )  # fmt: skip
    tasks = swe.load_tasks(str(write_jsonl(tmp_path / "words.jsonl", [row])), harness="pytest")
    gold_run = anyio.run(run_rollout, tasks, swe.make_policy("oracle"), tmp_path / "gold")
    empty_run = anyio.run(run_rollout, tasks, swe.make_policy("empty"), tmp_path / "empty")
    (resolved,), (unresolved,) = gold_run.trajectories, empty_run.trajectories
    assert resolved.success and set(resolved.info["tests"].values()) == {"PASSED"}, resolved.info
    assert not unresolved.success
    assert unresolved.info["tests"] == dict.fromkeys(row["FAIL_TO_PASS"], "FAILED"), unresolved.info["tests"]


# -- pytest plugins: the instance's own choice -----------------------------------------------


def plugin_instance(tmp_path: Path, **extra) -> dict:
    """A repository whose new test uses a fixture of an installed plugin (anyio's, installed
    with orchard-async), which pytest only has when it autoloads plugins."""
    _, base = small_repo(
        tmp_path,
        "backend",
        {"backend.py": "def name():\n    return None\n", "tests/test_plain.py": "def test_ok():\n    pass\n"},
    )
    tests = "from backend import name\n\n\ndef test_name(anyio_backend_name):\n    assert name() == 'asyncio'\n"
    gold = (
        "diff --git a/backend.py b/backend.py\n--- a/backend.py\n+++ b/backend.py\n"
        "@@ -1,2 +1,2 @@\n def name():\n-    return None\n+    return 'asyncio'\n"
    )
    return dict(
        instance_id="backend__1", repo="me/backend", repo_path="backend", base_commit=base, problem_statement="name",
        patch=gold, test_patch=new_file_patch("tests/test_backend.py", tests),
        FAIL_TO_PASS=["tests/test_backend.py::test_name[asyncio]"], PASS_TO_PASS=["tests/test_plain.py::test_ok"],
        test_command="python -m pytest -rA -p no:cacheprovider tests", **extra,
    )  # fmt: skip


@pytest.mark.soak  # 13-20 s of whole episodes; `pytest -m soak` (CI runs both)
def test_a_plugin_fixture_resolves_when_the_instance_allows_autoload(tmp_path):
    for allow in ("", "0"):  # "0" too: pytest would read any non-empty value as "off"
        row = plugin_instance(tmp_path / allow, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": allow})
        (task,) = swe.load_tasks(str(write_jsonl(tmp_path / allow / "plugin.jsonl", [row])))
        assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in task.spec.env
    run = anyio.run(run_rollout, [task], swe.make_policy("oracle"), tmp_path / "sbx")
    (trajectory,) = run.trajectories
    assert trajectory.success, trajectory.info.get("test_output_tail", trajectory.error)


def test_plugins_stay_off_by_default_where_the_recipe_prepares_the_repository(tmp_path):
    (task,) = swe.load_tasks(str(write_jsonl(tmp_path / "plugin.jsonl", [plugin_instance(tmp_path)])))
    assert task.spec.env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert all(t.spec.env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1" for t in swe.load_tasks("builtin"))
    run = anyio.run(run_rollout, [task], swe.make_policy("oracle"), tmp_path / "sbx")
    (trajectory,) = run.trajectories
    # without the plugin the fixture is unknown: the parametrized test never exists
    assert not trajectory.success and trajectory.info["tests"]["tests/test_backend.py::test_name[asyncio]"] == "MISSING"


# -- real SWE-bench rows: the image by SWE-bench's naming convention --------------------------


def test_a_row_with_no_image_and_no_repository_runs_in_swebench_image(tmp_path, monkeypatch):
    row = dict(BUILTIN[2], instance_id="someone__else-3", repo="someone/else")
    path = str(write_jsonl(tmp_path / "real.jsonl", [row]))
    (task,) = swe.load_tasks(path)
    assert task.source is None
    assert (task.spec.image, task.spec.workdir, task.spec.pull) == (
        "swebench/sweb.eval.x86_64.someone_1776_else-3:latest", "/testbed", "missing"
    )  # fmt: skip
    assert task.activation == swe.swebench_harness.CONDA_TESTBED
    assert task.spec.env["PATH"].startswith("/opt/miniconda3/envs/testbed/bin:")
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in task.spec.env  # SWE-bench's spec leaves autoload on
    (task,) = swe.load_tasks(
        path, image_registry="mirror.local:5000", image_namespace="team", image_tag="v2", pull="never"
    )
    assert (task.spec.image, task.spec.pull) == (
        "mirror.local:5000/team/sweb.eval.x86_64.someone_1776_else-3:v2",
        "never",
    )
    monkeypatch.setenv("ORCHARD_SWE_IMAGE_NAMESPACE", "")  # SWE-bench's local names, from the environment (CLI)
    monkeypatch.setenv("ORCHARD_SWE_PULL", "always")
    (task,) = swe.load_tasks(path)
    assert (task.spec.image, task.spec.pull) == ("sweb.eval.x86_64.someone__else-3:latest", "always")
    with pytest.raises(oa.ConfigError, match="pull"):
        swe.load_tasks(path, pull="sometimes")
    with pytest.raises(oa.ConfigError, match="harness must be one of auto, swebench, pytest, got 'official'"):
        swe.load_tasks(path, harness="official")


# -- SWE-bench's evaluation fields, with and without the swebench package -------------------


def test_the_eval_script_loses_its_test_patch_steps_and_keeps_the_rest():
    from tests.recipes.swebench_rows import eval_script

    row = BUILTIN[0]
    script = swe.swebench_harness.strip_test_patch_steps(eval_script(row), row["base_commit"])
    assert "git apply" not in script and "EOF_114329324912" not in script
    assert f"git checkout {row['base_commit']}" not in script
    assert row["test_patch"].splitlines()[0] not in script
    kept = [line for line in script.splitlines() if line]
    assert kept[:4] == [
        "#!/bin/bash",
        "set -uxo pipefail",
        "source /opt/miniconda3/bin/activate",
        "conda activate testbed",
    ]
    assert kept[4] == 'cd "$ORCHARD_REPO"' and f"git -c core.fileMode=false diff {row['base_commit']}" in kept
    assert kept[-3:] == [": '>>>>> Start Test Output'", row["test_command"], ": '>>>>> End Test Output'"]
    with pytest.raises(oa.ConfigError, match="applies the test patch 0 times"):
        swe.swebench_harness.strip_test_patch_steps("cd /testbed\npytest\n", row["base_commit"], "x.jsonl:1")


def test_rows_with_swebench_fields_fall_back_to_the_recipes_harness_without_the_package(tmp_path, monkeypatch):
    from tests.recipes.swebench_rows import official_row

    monkeypatch.setattr(swe.swebench_harness, "installed_version", lambda: None)
    path = str(write_jsonl(tmp_path / "rows.jsonl", [official_row(BUILTIN[0])]))
    with pytest.warns(UserWarning, match="1 instance.* carry SWE-bench's evaluation fields .*not installed"):
        (task,) = swe.load_tasks(path)
    assert isinstance(task.harness, swe.scoring.PytestHarness) and task.official is None
    with pytest.raises(oa.ConfigError, match="swebench package is not installed"):
        swe.load_tasks(path, harness="swebench")
    monkeypatch.setattr(swe.swebench_harness, "installed_version", lambda: "4.1.0")
    with pytest.raises(oa.ConfigError, match=r"swebench 4\.1\.0 is installed; the SWE recipe grades with swebench>=5"):
        swe.load_tasks(path, harness="swebench")
    (task,) = swe.load_tasks(path, harness="pytest")  # never asks for the package
    assert task.official is None

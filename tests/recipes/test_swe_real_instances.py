"""Real SWE-bench rows on docker, offline: an instance image laid out as SWE-bench's
(tests/recipes/swebench_image: the repository at /testbed, conda's activation script where
the official images have it) is built for one bundled repository and tagged by SWE-bench's
naming convention; a SWE-bench-format JSONL that names no image runs in it. Gold resolves,
empty does not, with the recipe's pytest harness and with swebench's own (its eval script
sources the activation); the agent's commands run in the activated environment at /testbed.
A missing image is one line naming it. Needs a daemon and the recipe's image
(`orchard-async images build`); skips without them (fails in CI)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async.recipes import swe
from orchard_async.recipes.swe import swebench_harness as official
from orchard_async.recipes.swe.builtin import make_repo
from orchard_async.recipes.swe.instances import patch_files
from orchard_async.recipes.swe.policies import gold_patch_command
from tests.conftest import backend_missing, require_docker
from tests.recipes.swe_support import ScriptPolicy
from tests.recipes.swebench_rows import BUILTIN, official_row

try:
    from orchard_async.adapters.docker import DockerAdapter
except ImportError as exc:  # aiodocker is an optional dependency
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"docker: {exc}; pip install 'orchard-async[docker]'", allow_module_level=True)

BASE_IMAGE = swe.IMAGES[0].tag  # the image definition builds FROM it
IMAGE_DIR = Path(__file__).parent / "swebench_image"
SOURCE = next(row for row in BUILTIN if row["instance_id"] == "minicalc__1")
INSTANCE_ID = "orchard__minicalc-1"  # a repository this machine has no source for: its image is the one
IMAGE = official.image_name(INSTANCE_ID)
BUILD_PRODUCT = "build-stamp.txt"  # untracked in the image: part of the environment, never of a patch
PROBE = (
    "command -v python && python -c 'import pytest; print(pytest.__file__)' && pwd && git rev-parse HEAD 'HEAD^{tree}'"
    " && git rev-list --all | wc -l"
)


def swebench_row() -> dict:
    """The bundled instance as a row of a SWE-bench dataset file: its names, no image, no
    test command, no source; the PASS_TO_PASS tests SWE-bench would keep (those in the files
    the test patch touches, which is what its test command runs)."""
    files = set(patch_files(SOURCE["test_patch"]))
    row = {key: SOURCE[key] for key in ("base_commit", "problem_statement", "patch", "test_patch", "FAIL_TO_PASS")}
    return {
        **row,
        "instance_id": INSTANCE_ID,
        "repo": "orchard/minicalc",
        "PASS_TO_PASS": json.dumps([t for t in SOURCE["PASS_TO_PASS"] if t.split("::")[0] in files]),
        "FAIL_TO_PASS": json.dumps(row["FAIL_TO_PASS"]),
        "version": "0.1",
        "environment_setup_commit": SOURCE["base_commit"],
        "hints_text": "",
        "created_at": "2026-12-02T00:00:00Z",
    }


def official_swebench_row() -> dict:
    """The same row as SWE-bench 5 ships it: with its eval script (sourcing the activation),
    log parser and eval type."""
    test_command = "pytest -rA " + " ".join(sorted(f for f in patch_files(SOURCE["test_patch"]) if f.endswith(".py")))
    return {**official_row({**swebench_row(), "test_command": test_command}), "test_command": ""}


@pytest.fixture(scope="module", autouse=True)
def swebench_style_image(tmp_path_factory):
    """The instance image, built from the image definition with the repository at its base
    commit in the build context (no network), tagged by SWE-bench's convention."""
    if shutil.which("docker") is None:
        backend_missing("docker: no docker CLI to build the test image")
    require_docker(BASE_IMAGE)
    context = tmp_path_factory.mktemp("swebench-image")
    for name in ("Dockerfile", "activate"):
        shutil.copy(IMAGE_DIR / name, context / name)
    assert make_repo.materialize(SOURCE["repo"], context / "testbed") == SOURCE["base_commit"]
    (context / "testbed" / BUILD_PRODUCT).write_text("left by the image's build, untracked, not ignored\n")
    built = subprocess.run(
        ["docker", "build", "-q", "-t", IMAGE, str(context)],
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    yield IMAGE
    subprocess.run(["docker", "rmi", "-f", IMAGE], capture_output=True, timeout=120)


def write_rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


async def rollout_on_docker(tasks: list, policy: object) -> list[oa.Trajectory]:
    adapter = DockerAdapter(run_id=f"t{uuid.uuid4().hex[:10]}")  # the tasks name the image
    try:
        found = [t async for t in oa.rollout(tasks, policy, adapter, concurrency=2)]
    finally:
        leaked = await adapter.list_owned()
        await adapter.close()
    assert leaked == []
    return found


@pytest.mark.parametrize("harness", ["pytest", "swebench"])
def test_gold_resolves_and_empty_does_not_in_the_image_named_by_convention(tmp_path, harness):
    if harness == "swebench" and not official.usable():
        backend_missing(f"swebench>={official.MIN_VERSION} is not installed: pip install -e '.[swebench]'")
    row = swebench_row() if harness == "pytest" else official_swebench_row()
    (task,) = swe.load_tasks(write_rows(tmp_path / "swe-bench.jsonl", [row]), harness=harness)
    assert task.source is None and (task.spec.image, task.spec.workdir) == (IMAGE, "/testbed")
    assert type(task.harness).__name__ == ("PytestHarness" if harness == "pytest" else "OfficialTests")

    probe_then_fix = ScriptPolicy([PROBE, gold_patch_command(task.instance.patch)], name="probe+gold")
    (gold,) = anyio.run(rollout_on_docker, [task], probe_then_fix)
    assert gold.status == "finished", gold.error
    assert gold.success and gold.info["harness"] == harness, gold.info.get("test_output_tail", gold.info)
    assert set(gold.info["tests"].values()) == {"PASSED"}
    assert patch_files(gold.info["patch"]) == patch_files(task.instance.patch)  # no build product in it
    # the agent worked in the activated environment, in the image's repository at base: the
    # base's tree as the one commit there is
    python, pytest_module, cwd, head, tree, commits = gold.steps[0].observation.split()
    assert python == "/opt/miniconda3/envs/testbed/bin/python" and pytest_module.endswith("pytest/__init__.py")
    make_repo.materialize(SOURCE["repo"], tmp_path / "base")
    base_tree = subprocess.run(
        ["git", "-C", str(tmp_path / "base"), "rev-parse", "HEAD^{tree}"], capture_output=True, text=True
    ).stdout.strip()
    assert (cwd, head, tree, commits) == ("/testbed", task.agent_base, base_tree, "1")

    (empty,) = anyio.run(rollout_on_docker, [task], swe.make_policy("empty"))
    assert (empty.status, empty.success) == ("finished", False), empty.error
    f2p = {test: empty.info["tests"][test] for test in task.instance.FAIL_TO_PASS}
    assert set(f2p.values()) <= {"FAILED", "ERROR"}, f2p


def test_an_activation_that_fails_is_named(tmp_path):
    row = {**swebench_row(), "activate": ". /opt/nowhere/bin/activate && conda activate testbed"}
    (task,) = swe.load_tasks(write_rows(tmp_path / "swe-bench.jsonl", [row]), harness="pytest")
    (trajectory,) = anyio.run(rollout_on_docker, [task], swe.make_policy("oracle"))
    assert (trajectory.status, trajectory.end_reason) == ("failed", "task_error")
    assert "the environment's activation failed: . /opt/nowhere/bin/activate" in trajectory.error
    assert trajectory.steps == []


def test_a_missing_image_is_one_line_naming_it(tmp_path):
    """Through the CLI, whose ``--tasks`` names only the file: the pull policy comes from
    ORCHARD_SWE_PULL."""
    row = {**swebench_row(), "instance_id": "orchard__absent-1"}
    tasks = write_rows(tmp_path / "swe-bench.jsonl", [row])
    (task,) = swe.load_tasks(tasks, pull="never")
    assert (task.spec.image, task.spec.pull) == ("swebench/sweb.eval.x86_64.orchard_1776_absent-1:latest", "never")
    done = subprocess.run(
        [sys.executable, "-m", "orchard_async.apps.cli", "run", "swe", "--tasks", tasks, "--adapter", "docker"]
        + ["--policy", "empty", "--episodes", "1", "--out", str(tmp_path / "out.jsonl")],
        env={**os.environ, "ORCHARD_SWE_PULL": "never"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and task.spec.image in lines[0] and "pull='never'" in lines[0], done.stderr


# Whole recipes (or floors) on docker, 20-50 s each: left to `pytest -m soak` so the default run stays
# under 5 minutes on 2 cores; CI runs both.
pytestmark = pytest.mark.soak

"""Rows written for the tests in each SWE dataset's own format, and build contexts for
images laid out as each publisher's are (the repository where its images keep it, its test
runner installed), all from one bundled instance (minicalc__1) and one small Go module.

Nothing here is a publisher's task: the repositories are the recipe's own; only the shapes
(field names, paths, conventions) are theirs, as their dataset cards and harnesses give them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from orchard_async.recipes.swe import swebench_harness as official
from orchard_async.recipes.swe.builtin import make_repo
from orchard_async.recipes.swe.instances import patch_files
from tests.recipes.swebench_rows import BUILTIN, HEREDOC

SOURCE = next(row for row in BUILTIN if row["instance_id"] == "minicalc__1")
BASE_IMAGE = "orchard/swe-python:bookworm"
ACTIVATE = Path(__file__).parent / "swebench_image" / "activate"
TEST_FILES = sorted(f for f in patch_files(SOURCE["test_patch"]) if f.endswith(".py"))
_P2P = SOURCE["PASS_TO_PASS"]
P2P = [t for t in (json.loads(_P2P) if isinstance(_P2P, str) else _P2P) if t.split("::")[0] in TEST_FILES]
F2P = list(SOURCE["FAIL_TO_PASS"])


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    done = subprocess.run(["git", "-C", str(repo), *args], input=stdin, env=env, capture_output=True, text=True)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


def commit_patch(repo: Path, patch: str, message: str, *, reverse: bool = False) -> str:
    git(repo, "apply", *(["-R"] if reverse else []), "-", stdin=patch)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD").strip()


def minicalc(at: Path) -> str:
    commit = make_repo.materialize(SOURCE["repo"], at)
    assert commit == SOURCE["base_commit"]
    return commit


def dockerfile(context: Path, repo_dir: str, *, conda: bool = False, extra: str = "") -> None:
    lines = [f"FROM {BASE_IMAGE}"]
    if conda:  # SWE-smith's images, as SWE-bench's: conda's activation, a `testbed` env
        shutil.copy(ACTIVATE, context / "activate")
        lines += [
            "COPY activate /opt/miniconda3/bin/activate",
            "RUN mkdir -p /opt/miniconda3/envs/testbed/bin && ln -s /usr/bin/python3 /opt/miniconda3/envs/testbed/bin/python",
        ]
    if extra:
        lines.append(extra)
    lines += [f"COPY repo {repo_dir}", f"WORKDIR {repo_dir}"]
    (context / "Dockerfile").write_text("\n".join(lines) + "\n")


def build(context: Path, tag: str) -> None:
    built = subprocess.run(
        ["docker", "build", "-q", "-t", tag, str(context)],
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stderr


# -- SWE-rebench-V2: image_name, install_config, the repository at /<repo name> -----------


def rebench(context: Path) -> tuple[dict[str, Any], str]:
    minicalc(context / "repo")
    dockerfile(context, "/minicalc")
    image = "orchard-test/swe-rebench-v2-minicalc:1"
    row = {
        "instance_id": "orchard__minicalc-1",
        "repo": "orchard/minicalc",
        "base_commit": SOURCE["base_commit"],
        "patch": SOURCE["patch"],
        "test_patch": SOURCE["test_patch"],
        "problem_statement": SOURCE["problem_statement"],
        "hints_text": "",
        "created_at": "2026-12-04T00:00:00Z",
        "language": "python",
        "image_name": image,
        "FAIL_TO_PASS": F2P,
        "PASS_TO_PASS": P2P,
        "install_config": {
            "base_image_name": "python:3.11",
            "install": ["pip install -e ."],
            "test_cmd": "pytest -rA " + " ".join(TEST_FILES),
            "log_parser": "parse_log_pytest",
        },
        "meta": {"license": "MIT"},
    }
    return row, image


# -- Scale-SWE: image_url, workdir, parent_commit, pre_commands, f2p_patch + f2p_script ---

F2P_SCRIPT = """from minicalc import evaluate


def test_power_chain_groups_from_the_right():
    assert evaluate("2 ^ 3 ^ 2") == 512
"""


def scale(context: Path) -> tuple[dict[str, Any], str]:
    repo = context / "repo"
    base = minicalc(repo)
    after = commit_patch(repo, SOURCE["patch"], "the fix")  # the pull request's commit
    git(repo, "checkout", "-q", base)
    dockerfile(context, "/data/minicalc")
    image = "orchard-test/scale-swe-minicalc:1"
    row = {
        "instance_id": "orchard_minicalc_pr1",
        "user": "orchard",
        "repo": "minicalc",
        "language": "python",
        "workdir": "/data/minicalc",
        "image_url": image,
        "patch": SOURCE["patch"],
        "pr_commit": after,
        "parent_commit": base,
        "problem_statement": SOURCE["problem_statement"],
        "f2p_patch": SOURCE["test_patch"],
        "f2p_script": F2P_SCRIPT,
        "FAIL_TO_PASS": [*F2P, "test_fail_to_pass.py::test_power_chain_groups_from_the_right"],
        "PASS_TO_PASS": P2P,
        "github_url": "https://github.invalid/orchard/minicalc",
        "pre_commands": f"git checkout -q {base}",
    }
    return row, image


# -- SWE-smith: swesmith/<owner>__<name>.<commit>, a branch per instance, patch = the bug --


def smith(context: Path) -> tuple[dict[str, Any], str]:
    repo = context / "repo"
    minicalc(repo)
    commit_patch(repo, SOURCE["test_patch"], "tests")
    clean = commit_patch(repo, SOURCE["patch"], "upstream, fixed")
    instance_id = f"orchard__minicalc.{clean[:8]}.combine_file__pow1"
    git(repo, "checkout", "-q", "-b", instance_id)
    commit_patch(repo, SOURCE["patch"], "bug: powers group from the left", reverse=True)
    bug = git(repo, "diff", clean, instance_id)
    git(repo, "checkout", "-q", clean)  # the image's own state: the clean repository
    dockerfile(context, "/testbed", conda=True)
    image = f"orchard-test/swesmith.x86_64.orchard_1776_minicalc.{clean[:8]}"
    row = {
        "instance_id": instance_id,
        "repo": f"swesmith/orchard__minicalc.{clean[:8]}",
        "patch": bug,
        "FAIL_TO_PASS": F2P,
        "PASS_TO_PASS": P2P,
        "created_at": "2026-12-04T00:00:00",
        "image_name": image,
        "problem_statement": SOURCE["problem_statement"],
    }
    return row, image


# -- SWE-bench Pro: dockerhub_tag, /app, before_repo_set_cmd, run_script.sh + parser.py ---

RUN_SCRIPT = """#!/bin/bash
# Runs the selected test files (comma-separated in $1) from /app.
set -e
cd /app
IFS=',' read -r -a files <<< "$1"
python3 -m pytest -rA -p no:cacheprovider "${files[@]}" || true
"""

PARSER = """import json
import re
import sys

# pytest -rA's short summary: "PASSED tests/x.py::test_y" (FAILED lines may end in " - reason").
LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\\S+)")


def main(stdout_path, stderr_path, output_path):
    tests = []
    with open(stdout_path) as out:
        for line in out:
            found = LINE.match(line.strip())
            if found:
                tests.append({"name": found.group(2), "status": found.group(1)})
    with open(output_path, "w") as out:
        json.dump({"tests": tests}, out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
"""


def pro(context: Path, scripts_dir: Path) -> tuple[dict[str, Any], str]:
    repo = context / "repo"
    base = minicalc(repo)
    gold = commit_patch(repo, SOURCE["test_patch"] + SOURCE["patch"], "the fix and its tests")
    git(repo, "checkout", "-q", base)
    dockerfile(context, "/app")
    instance_id = f"instance_orchard__minicalc-{gold}"
    folder = scripts_dir / instance_id
    folder.mkdir(parents=True)
    (folder / "run_script.sh").write_text(RUN_SCRIPT)
    (folder / "parser.py").write_text(PARSER)
    tag = f"orchard.minicalc-orchard__minicalc-{gold[:12]}"
    row = {
        "repo": "orchard/minicalc",
        "instance_id": instance_id,
        "base_commit": base,
        "patch": SOURCE["patch"],
        "test_patch": SOURCE["test_patch"],
        "problem_statement": SOURCE["problem_statement"],
        "requirements": "Chains of `^` must group from the right.",
        "interface": "No new interfaces are introduced.",
        "repo_language": "python",
        "fail_to_pass": repr(F2P),
        "pass_to_pass": repr(P2P),
        "issue_specificity": "['major_bug']",
        "issue_categories": "['core_feat']",
        "before_repo_set_cmd": f"git reset --hard {base}\ngit clean -fd\ngit checkout {base}\n"
        f"git checkout {gold} -- {' '.join(TEST_FILES)}",
        "selected_test_files_to_run": repr(TEST_FILES),
        "dockerhub_tag": tag,
    }
    return row, f"jefzda/sweap-images:{tag}"


# -- SWE-bench Multilingual: a Go module, graded by swebench's parse_log_gotest -----------

GO_MOD = "module example.invalid/gocalc\n\ngo 1.19\n"
GO_CODE = """package gocalc

// Clamp limits v to the closed interval [lo, hi].
func Clamp(v, lo, hi int) int {
	if v < lo {
		return lo
	}
	if v > hi {
		return lo
	}
	return v
}

// Sum adds the numbers.
func Sum(values ...int) int {
	total := 0
	for _, v := range values {
		total += v
	}
	return total
}
"""
GO_TESTS = """package gocalc

import "testing"

func TestSum(t *testing.T) {
	if Sum(1, 2, 3) != 6 {
		t.Fatal("Sum(1, 2, 3) != 6")
	}
}
"""
GO_NEW_TEST = """
func TestClampAbove(t *testing.T) {
	if got := Clamp(12, 0, 10); got != 10 {
		t.Fatalf("Clamp(12, 0, 10) = %d, want 10", got)
	}
}
"""


def multilingual(context: Path) -> tuple[dict[str, Any], str]:
    repo = context / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "go.mod").write_text(GO_MOD)
    (repo / "calc.go").write_text(GO_CODE)
    (repo / "calc_test.go").write_text(GO_TESTS)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "gocalc")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc.go").write_text(GO_CODE.replace("return lo\n\t}\n\treturn v", "return hi\n\t}\n\treturn v"))
    patch = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    with open(repo / "calc_test.go", "a") as tests:
        tests.write(GO_NEW_TEST)
    test_patch = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    dockerfile(
        context,
        "/testbed",
        extra="RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends golang-go >/dev/null "
        "&& rm -rf /var/lib/apt/lists/*\nENV GOFLAGS=-mod=mod GOTOOLCHAIN=local",
    )
    eval_script = "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "cd /testbed",
            "git config --global --add safe.directory /testbed",
            "cd /testbed",
            "git status",
            "git show",
            f"git -c core.fileMode=false diff {base}",
            f"git checkout {base} calc_test.go",
            f"git apply -v - <<'{HEREDOC}'\n{test_patch}\n{HEREDOC}",
            ": '>>>>> Start Test Output'",
            "go test -v ./...",
            ": '>>>>> End Test Output'",
            f"git checkout {base} calc_test.go",
        ]
    )
    instance_id = "orchard__gocalc-1"
    row = {
        "repo": "orchard/gocalc",
        "instance_id": instance_id,
        "base_commit": base,
        "patch": patch,
        "test_patch": test_patch,
        "problem_statement": "Clamp returns the lower bound for values above the upper one.\n",
        "hints_text": "",
        "created_at": "2026-12-04T00:00:00Z",
        "version": "0.1",
        "FAIL_TO_PASS": json.dumps(["TestClampAbove"]),
        "PASS_TO_PASS": json.dumps(["TestSum"]),
        "environment_setup_commit": base,
        "eval_script": eval_script + "\n",
        "log_parser": "parse_log_gotest",
        "eval_type": "pass_and_fail",
    }
    return row, official.image_name(instance_id)

"""The SWE datasets' own row formats, read as their publishers publish them.

Each format maps its row onto the fields the recipe works with (SWE-bench's names) plus
what decides where the repository is, how the sandbox is entered, what runs the tests and
how their log is read. Nothing of the row is rewritten: its own fields stay in the
instance's ``extra`` (and so in the trajectory). Formats, by the fields that identify them:

* ``swe-bench`` (Verified, Multilingual, Lite, our own rows): ``instance_id``, ``repo``,
  ``base_commit``, ``patch``, ``test_patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``; graded by
  the ``swebench`` package when the row carries its evaluation fields (swebench_harness).
* ``swe-rebench-v2`` (nebius/SWE-rebench-V2): ``image_name`` and ``install_config``
  (``test_cmd``, ``log_parser``, ``install``). The image's repository is at ``/<repo name>``
  (its WORKDIR); the tests are ``test_cmd`` after the test patch, their log read by the
  parser of that name (swebench's parser functions), FAIL_TO_PASS/PASS_TO_PASS decide.
  ``install`` is what built the image: recorded, not run again.
* ``scale-swe`` (AweAI-Team/Scale-SWE): ``image_url``, ``workdir``, ``parent_commit``
  (the base), ``pre_commands`` (run on entering the container, before anything else),
  ``f2p_patch`` (the tests, applied for evaluation) and ``f2p_script`` (written as
  ``test_fail_to_pass.py`` at the repository's root for evaluation); pytest on the files of
  the listed tests.
* ``swe-smith`` (SWE-bench/SWE-smith): ``repo`` ``swesmith/<owner>__<name>.<commit>``,
  ``image_name`` (else SWE-smith's naming convention). The instance is a branch named by
  its id in the image's repository; ``patch`` is the bug, so the fix is its reverse. The
  tests: SWE-smith's pytest command (``--verbose``) on the FAIL_TO_PASS files in the image's
  conda env, its verbose lines read as SWE-smith's Python profiles read them.
* ``swe-bench-pro`` (ScaleAI/SWE-bench_Pro): ``dockerhub_tag`` (image
  ``jefzda/sweap-images:<tag>``, the repository at ``/app``), ``before_repo_set_cmd`` (its
  last line puts the test files in place, in place of the test patch),
  ``selected_test_files_to_run``, ``fail_to_pass``/``pass_to_pass`` (Python list literals);
  graded by the instance's own ``run_script.sh`` and ``parser.py`` (from the evaluation
  repository's ``run_scripts/<instance_id>/``, a recipe option) run in the scoring sandbox;
  resolved when every listed test is PASSED in the parser's ``output.json``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SWE_BENCH = "swe-bench"
REBENCH = "swe-rebench-v2"
SCALE = "scale-swe"
SMITH = "swe-smith"
PRO = "swe-bench-pro"

# `--tasks PREFIX:FILE` names a format instead of detecting it; short names too.
PREFIXES = {
    SWE_BENCH: SWE_BENCH,
    "swe-bench-multilingual": SWE_BENCH,
    REBENCH: REBENCH,
    "swe-rebench": REBENCH,
    SCALE: SCALE,
    SMITH: SMITH,
    PRO: PRO,
}

PRO_IMAGE_REPOSITORY = "jefzda/sweap-images"  # where SWE-bench Pro publishes its images
PRO_WORKDIR = "/app"
SMITH_IMAGE_NAMESPACE = "jyangballin"  # where SWE-smith publishes its images
SMITH_WORKDIR = "/testbed"
SMITH_TEST_COMMAND = "pytest --disable-warnings --color=no --tb=no --verbose"
SCALE_F2P_SCRIPT = "test_fail_to_pass.py"
_ANSI = re.compile(r"\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])")
_SMITH_REPO = re.compile(r"^swesmith/(?P<owner>[^/_]+(?:_[^/_]+)*)__(?P<name>[^/]+)\.(?P<commit>[0-9a-f]{6,40})$")
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


class FormatError(Exception):
    """A row that does not hold to its format; the loader adds file, line and id."""


@dataclass(frozen=True)
class ProScripts:
    """SWE-bench Pro's per-instance evaluation: its scripts, the test files they run, and
    the command that puts those test files in place."""

    run_script: str
    parser: str
    test_files: tuple[str, ...]
    before_tests: str


@dataclass(frozen=True)
class Mapped:
    """A row as the recipe reads it: SWE-bench-named fields, and how to run and grade it."""

    fields: dict[str, Any]  # SWE-bench's names (instance_id, repo, base_commit, ...)
    image: str | None = None
    workdir: str | None = None  # where the image keeps the repository
    enter_commands: tuple[str, ...] = ()  # run first in a new sandbox, before the checkout is adopted
    test_command: str = ""
    log_parser: str = ""  # a swebench parser function's name: reads the test command's whole log
    activate: str = ""
    gold_reverse: bool = False  # the row's patch is the bug: the fix is its reverse
    test_stage: str = ""  # shell that puts the tests in place, instead of the test patch
    pro: ProScripts | None = None


@dataclass(frozen=True)
class Context:
    base_dir: Path | None  # the dataset file's folder
    pro_scripts: Path | None  # SWE-bench Pro's run_scripts folder


@dataclass(frozen=True)
class Format:
    name: str
    identifying: tuple[str, ...]  # fields only this format's rows have (all of them)
    required: tuple[str, ...]
    read: Callable[[dict[str, Any], Context], Mapped]


def _need(row: Mapping[str, Any], fmt: Format) -> None:
    missing = [key for key in fmt.required if key not in row or row[key] is None]
    if missing:
        raise FormatError(
            f"a {fmt.name} row needs field{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}"
        )


def _text(row: Mapping[str, Any], key: str, default: str = "") -> str:
    value = row.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise FormatError(f"field {key!r} must be a string, got {type(value).__name__}")
    return value


def _commands(row: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = row.get(key)
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return tuple(line for line in value.splitlines() if line.strip())
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(item for item in value if item.strip())
    raise FormatError(f"field {key!r} must be a string or a list of strings")


def _ids(row: Mapping[str, Any], key: str, *, literal: bool = False) -> list[str]:
    """A list of test ids, as a list or as the text of one (JSON, or a Python literal)."""
    value = row.get(key)
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value) if literal else json.loads(value)
        except (ValueError, SyntaxError) as exc:
            raise FormatError(f"field {key!r} is a string but not a list of test ids: {exc}") from None
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise FormatError(f"field {key!r} must be a list of test ids")
    return list(value)


def test_files_of(ids: list[str]) -> list[str]:
    """The files of pytest node ids, in order of first appearance."""
    files: list[str] = []
    for test in ids:
        path = test.split("::", 1)[0]
        if path not in files:
            files.append(path)
    return files


def new_file_diff(path: str, text: str) -> str:
    """A git diff that creates ``path`` with ``text``."""
    lines = text.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    tail = "" if text.endswith("\n") or not lines else "\\ No newline at end of file\n"
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{body}{tail}"
    )


# -- the formats ---------------------------------------------------------------------------


def _swe_bench(row: dict[str, Any], context: Context) -> Mapped:
    return Mapped(fields=row)


def _rebench(row: dict[str, Any], context: Context) -> Mapped:
    _need(row, REBENCH_FORMAT)
    config = row["install_config"]
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as exc:
            raise FormatError(f"field 'install_config' is a string but not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise FormatError("field 'install_config' must be an object")
    for key in ("test_cmd", "log_parser"):
        if not isinstance(config.get(key), str) or not config[key].strip():
            raise FormatError(f"field 'install_config' needs a non-empty string {key!r}")
    repo = _text(row, "repo")
    fields = {
        **row,
        "FAIL_TO_PASS": [_ANSI.sub("", t).strip() for t in _ids(row, "FAIL_TO_PASS")],
        "PASS_TO_PASS": [_ANSI.sub("", t).strip() for t in _ids(row, "PASS_TO_PASS")],
    }
    test_cmd = config["test_cmd"]
    return Mapped(
        fields=fields,
        image=_text(row, "image_name"),
        workdir="/" + repo.rstrip("/").rsplit("/", 1)[-1],
        test_command=" && ".join(test_cmd) if isinstance(test_cmd, list) else test_cmd,
        log_parser=config["log_parser"],
    )


def _scale(row: dict[str, Any], context: Context) -> Mapped:
    _need(row, SCALE_FORMAT)
    user, name = _text(row, "user"), _text(row, "repo")
    f2p, p2p = _ids(row, "FAIL_TO_PASS"), _ids(row, "PASS_TO_PASS")
    test_patch = _text(row, "f2p_patch")
    script = _text(row, "f2p_script")
    if script.strip():
        test_patch = (test_patch if test_patch.endswith("\n") or not test_patch else test_patch + "\n") + new_file_diff(
            SCALE_F2P_SCRIPT, script
        )
    if not test_patch.strip():
        raise FormatError("a scale-swe row needs 'f2p_patch' or 'f2p_script' (the tests its grading adds)")
    files = test_files_of(f2p + p2p)
    workdir = _text(row, "workdir").rstrip("/") or None
    if workdir is None or not workdir.startswith("/"):
        raise FormatError("field 'workdir' must be an absolute path")
    return Mapped(
        fields={
            **row,
            "repo": f"{user}/{name}" if user else name,
            "base_commit": _text(row, "parent_commit"),
            "test_patch": test_patch,
            "FAIL_TO_PASS": f2p,
            "PASS_TO_PASS": p2p,
        },
        image=_text(row, "image_url"),
        workdir=workdir,
        enter_commands=_commands(row, "pre_commands"),
        test_command="python -m pytest -rA -p no:cacheprovider " + " ".join(files),
    )


def smith_image_name(repo: str) -> str:
    """SWE-smith's image for a ``swesmith/<owner>__<name>.<commit>`` repository."""
    match = _SMITH_REPO.match(repo)
    if match is None:
        raise FormatError(f"field 'repo' must be swesmith/<owner>__<name>.<commit>, got {repo!r}")
    return f"{SMITH_IMAGE_NAMESPACE}/swesmith.x86_64.{match['owner']}_1776_{match['name']}.{match['commit']}".lower()


def _smith(row: dict[str, Any], context: Context) -> Mapped:
    _need(row, SMITH_FORMAT)
    instance_id, repo = _text(row, "instance_id"), _text(row, "repo")
    if not _REF.match(instance_id) or ".." in instance_id:
        raise FormatError(
            f"field 'instance_id' must be a git branch name (SWE-smith's instances are), got {instance_id!r}"
        )
    image = _text(row, "image_name") or smith_image_name(repo)
    f2p = _ids(row, "FAIL_TO_PASS")
    quoted = " ".join(f"'{path}'" for path in test_files_of(f2p))
    return Mapped(
        fields={**row, "base_commit": instance_id, "test_patch": row.get("test_patch") or "", "FAIL_TO_PASS": f2p},
        image=image,
        workdir=SMITH_WORKDIR,
        # The instance is a branch of the image's repository (fetched when the image lacks it).
        enter_commands=(
            f"git checkout -q {instance_id} 2>/dev/null || {{ git fetch -q && git checkout -q {instance_id}; }}",
        ),
        test_command=f"{SMITH_TEST_COMMAND} {quoted}",
        log_parser="pytest_verbose",
        gold_reverse=True,
    )


def _pro(row: dict[str, Any], context: Context) -> Mapped:
    _need(row, PRO_FORMAT)
    instance_id = _text(row, "instance_id")
    f2p = _ids(row, "fail_to_pass" if "fail_to_pass" in row else "FAIL_TO_PASS", literal=True)
    p2p = _ids(row, "pass_to_pass" if "pass_to_pass" in row else "PASS_TO_PASS", literal=True)
    selected = _ids(row, "selected_test_files_to_run", literal=True)
    before = [line for line in _text(row, "before_repo_set_cmd").strip().split("\n") if line.strip()]
    if not before:
        raise FormatError("field 'before_repo_set_cmd' is empty (its last line puts the test files in place)")
    folder = context.pro_scripts
    if folder is None:
        raise FormatError(
            "SWE-bench Pro grades with run_scripts/<instance_id>/: give the folder (recipe option pro_scripts)"
        )
    scripts = {}
    for name in ("run_script.sh", "parser.py"):
        path = folder / instance_id / name
        if not path.is_file():
            raise FormatError(f"SWE-bench Pro's {name} for this instance is missing: {path}")
        scripts[name] = path.read_text(encoding="utf-8")
    statement = _text(row, "problem_statement")
    # Pro's agents see the requirements and the new interface after the issue.
    for key, heading in (("requirements", "Requirements"), ("interface", "New interfaces introduced")):
        extra = _text(row, key).strip()
        if extra:
            statement = f"{statement.rstrip()}\n\n{heading}:\n{extra}\n"
    tag = _text(row, "dockerhub_tag")
    return Mapped(
        fields={**row, "problem_statement": statement, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p},
        image=f"{PRO_IMAGE_REPOSITORY}:{tag}" if tag else None,
        workdir=PRO_WORKDIR,
        test_stage=before[-1],
        pro=ProScripts(scripts["run_script.sh"], scripts["parser.py"], tuple(selected), before[-1]),
    )


SWE_BENCH_FORMAT = Format(
    SWE_BENCH,
    (),
    ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS"),
    _swe_bench,
)
REBENCH_FORMAT = Format(
    REBENCH,
    ("install_config", "image_name"),
    ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch", "image_name", "install_config"),
    _rebench,
)
SCALE_FORMAT = Format(
    SCALE,
    ("image_url", "parent_commit"),
    ("instance_id", "repo", "workdir", "image_url", "parent_commit", "problem_statement", "patch", "FAIL_TO_PASS"),
    _scale,
)
SMITH_FORMAT = Format(
    SMITH,
    (),  # identified by its repo's name
    ("instance_id", "repo", "problem_statement", "patch", "FAIL_TO_PASS", "PASS_TO_PASS"),
    _smith,
)
PRO_FORMAT = Format(
    PRO,
    ("before_repo_set_cmd", "selected_test_files_to_run"),
    ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch", "before_repo_set_cmd"),
    _pro,
)
FORMATS = {f.name: f for f in (SWE_BENCH_FORMAT, REBENCH_FORMAT, SCALE_FORMAT, SMITH_FORMAT, PRO_FORMAT)}


def detect(row: Mapping[str, Any]) -> Format:
    """The format whose identifying fields the row has; else SWE-bench's (whose loader then
    names each field the row lacks)."""
    for fmt in (PRO_FORMAT, REBENCH_FORMAT, SCALE_FORMAT):
        if all(key in row for key in fmt.identifying):
            return fmt
    if isinstance(row.get("repo"), str) and row["repo"].startswith("swesmith/"):
        return SMITH_FORMAT
    return SWE_BENCH_FORMAT


def read(row: dict[str, Any], context: Context, name: str | None = None) -> tuple[Format, Mapped]:
    """The row read in its format: ``name`` when given (a ``--tasks`` prefix), else detected."""
    fmt = FORMATS[name] if name else detect(row)
    return fmt, fmt.read(row, context)

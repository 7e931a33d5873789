"""SWE-bench's own harness, through the official ``swebench`` package (the optional extra).

With ``pip install 'orchard-async[swebench]'`` (swebench 5), an instance that carries
SWE-bench's evaluation fields -- ``version``, ``eval_script``, ``log_parser``,
``eval_type``, as the SWE-bench datasets do -- is graded as the official harness grades
it: swebench's ``make_test_spec`` builds its test spec; the eval script runs (environment
activation, the repository's install step, the test command between swebench's output
markers, the test command's exit code recorded after them); the log is parsed by the
parser swebench names for it and the verdict is swebench's ``get_eval_report``. Without
the extra, or for instances without those fields, the recipe's own pytest ``-rA`` parser
grades (see scoring.py).

Two things are the recipe's own and deliberately stricter than the official runner: the
test patch is applied by the recipe (its files reverted to base first, so the agent cannot
pre-create them, and a test patch that does not apply is a VerifierError, not a silent
unresolved), so the eval script's own reset/apply steps are taken out; and the tests run
in a clean sandbox with fresh bytecode (scoring.py).

Also here, without needing the package: SWE-bench's image naming convention and the
environment its images use (a conda env ``testbed`` under /opt/miniconda3).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any

from orchard_async import ConfigError
from orchard_async.recipes.swe.instances import Instance

OFFICIAL_FIELDS = ("version", "eval_script", "log_parser", "eval_type")
MIN_VERSION = 5  # swebench 5 keeps each instance's eval script, parser and eval type in the data
START_MARK = ">>>>> Start Test Output"
END_MARK = ">>>>> End Test Output"
EXIT_CODE_MARK = ">>>>> Test Exit Code"
_EXIT_CODE = re.compile(rf"{re.escape(EXIT_CODE_MARK)}:\s*(-?\d+)")
# The eval script's test-patch steps: `git apply ... <<'EOF_x'` + the patch + `EOF_x`, and
# `git checkout <base_commit> <test files>` before (reset) and after (revert) the run.
_APPLY_HEREDOC = re.compile(
    r"^git apply\b[^\n]*<<-?[ \t]*(['\"]?)(?P<tag>\w+)\1[^\n]*\n.*?^(?P=tag)[ \t]*(?:\n|\Z)", re.M | re.S
)
_CD_TESTBED = re.compile(r"^cd /testbed/?[ \t]*$", re.M)

# -- SWE-bench's images ---------------------------------------------------------------------

NAMESPACE = "swebench"  # where SWE-bench publishes its instance images (Docker Hub)
TAG = "latest"
ARCH = "x86_64"
OFFICIAL_IMAGE_MARK = "sweb.eval."  # every SWE-bench instance image's name has it
CONDA_ROOT = "/opt/miniconda3"
CONDA_ENV = "testbed"


def image_name(
    instance_id: str,
    *,
    namespace: str | None = NAMESPACE,
    registry: str | None = None,
    tag: str = TAG,
    arch: str = ARCH,
) -> str:
    """SWE-bench's name for an instance's image, as swebench's ``ImageSpec.name`` makes it:
    ``sweb.eval.<arch>.<id>:<tag>``; under a namespace (a remote image) ``__`` is written
    ``_1776_`` (Docker Hub refuses double underscores); all lowercase. ``registry`` goes in
    front (``ghcr.io/...``, a local mirror). tests/recipes/test_swe_parity.py checks this
    against swebench's own function."""
    key = f"sweb.eval.{arch}.{instance_id}:{tag}"
    if namespace is not None:
        key = f"{namespace}/{key}".replace("__", "_1776_")
    key = key.lower()
    return f"{registry.rstrip('/')}/{key}" if registry else key


def is_official_image(image: str | None) -> bool:
    return bool(image) and OFFICIAL_IMAGE_MARK in image.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Activation:
    """How an image's project environment is switched on.

    ``prefix`` is POSIX shell the recipe runs before its own commands in the sandbox
    (setup commands, the harness proof, the test run). ``env`` is what that activation
    leaves in the environment, given to the sandbox itself, so the agent's commands run in
    the activated environment too (the episode loop runs them as they are, with the
    sandbox's environment). At setup, the harness proof checks both give the same ``python``.
    """

    prefix: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def wrap(self, script: str) -> str:
        return f"{self.prefix}\n{script}" if self.prefix else script


# What `source /opt/miniconda3/bin/activate && conda activate testbed` does in SWE-bench's
# images (their PATH before it: conda's bin, then Debian/Ubuntu's default).
CONDA_TESTBED = Activation(
    prefix=f". {CONDA_ROOT}/bin/activate && conda activate {CONDA_ENV}",
    env={
        "PATH": f"{CONDA_ROOT}/envs/{CONDA_ENV}/bin:{CONDA_ROOT}/condabin:{CONDA_ROOT}/bin:"
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "CONDA_PREFIX": f"{CONDA_ROOT}/envs/{CONDA_ENV}",
        "CONDA_DEFAULT_ENV": CONDA_ENV,
        "CONDA_SHLVL": "1",
        "CONDA_EXE": f"{CONDA_ROOT}/bin/conda",
        "CONDA_PYTHON_EXE": f"{CONDA_ROOT}/bin/python",
    },
)

# -- the package ------------------------------------------------------------------------------


def installed_version() -> str | None:
    """swebench's version when it is installed, else None (cheap: no harness import)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("swebench")
    except PackageNotFoundError:
        return None


def usable() -> bool:
    found = installed_version()
    return found is not None and _major(found) >= MIN_VERSION


def _major(version: str) -> int:
    match = re.match(r"(\d+)", version)
    return int(match.group(1)) if match else 0


def has_official_fields(instance: Instance) -> bool:
    return all(isinstance(instance.extra.get(key), str) and instance.extra[key].strip() for key in OFFICIAL_FIELDS)


_harness: dict[str, Any] = {}


def _swebench() -> dict[str, Any]:
    """swebench's harness functions, imported once (the import takes seconds: load time only)."""
    found = installed_version()
    if found is None:
        raise ConfigError("the swebench package is not installed: pip install 'orchard-async[swebench]'")
    if _major(found) < MIN_VERSION:
        raise ConfigError(
            f"swebench {found} is installed; the SWE recipe grades with swebench>={MIN_VERSION}: "
            "pip install -U 'orchard-async[swebench]'"
        )
    if not _harness:
        from swebench.harness import grading
        from swebench.harness.log_parsers import PARSER_REGISTRY
        from swebench.harness.utils import make_test_spec

        _harness.update(
            make_test_spec=make_test_spec,
            get_logs_eval=grading.get_logs_eval,
            get_eval_report=grading.get_eval_report,
            resolve_case=getattr(grading, "_resolve_case", None),
            parsers=PARSER_REGISTRY,
        )
    return _harness


def parser_by_name(name: str) -> Any:
    """swebench's log parser function ``name`` (``parse_log_pytest``, ``parse_log_gotest``,
    ...), called as ``parser(log, test_spec)``; ConfigError when there is none of that name."""
    parsers = _swebench()["parsers"]
    if name not in parsers:
        raise ConfigError(f"swebench has no log parser {name!r} (it has {len(parsers)}, e.g. parse_log_pytest)")
    return parsers[name]


def swebench_row(instance: Instance, image: str | None) -> dict[str, Any]:
    """The instance as a SWE-bench dataset row (what swebench's functions take)."""
    return {
        **instance.extra,
        "instance_id": instance.instance_id,
        "repo": instance.repo,
        "base_commit": instance.base_commit,
        "patch": instance.patch,
        "test_patch": instance.test_patch,
        "problem_statement": instance.problem_statement,
        "FAIL_TO_PASS": list(instance.FAIL_TO_PASS),
        "PASS_TO_PASS": list(instance.PASS_TO_PASS),
        "image": image or instance.image or "",
    }


@dataclass(frozen=True)
class OfficialRun:
    """What swebench made of one test log."""

    status_map: dict[str, str]  # test id -> status, as swebench's parser reported them
    found: bool  # swebench found a test run in the log (get_logs_eval's second value)
    exit_code: int | None  # the test command's own exit status, recorded after the end marker
    graded: dict[str, Any]  # resolved, tests (id -> status or MISSING), tests_status (report shape)


@dataclass(frozen=True)
class OfficialHarness:
    """SWE-bench's grading of one instance: the eval script to run and the judge of its log."""

    instance: Instance
    test_spec: Any  # swebench.types.TestSpec
    script: str  # the eval script without its test-patch steps (the recipe applies that patch)

    @property
    def key(self) -> tuple:
        return ("swebench", self.script, self.test_spec.log_parser, self.test_spec.eval_type)

    @classmethod
    def build(cls, instance: Instance, image: str | None) -> OfficialHarness:
        """swebench's test spec for the instance; ConfigError (naming it) when swebench
        cannot make one or its eval script is not one this recipe can run."""
        api = _swebench()
        where = f"{instance.where}: instance {instance.instance_id!r}"
        parser = instance.extra["log_parser"]
        if parser not in api["parsers"]:
            raise ConfigError(f"{where}: swebench has no log parser {parser!r}")
        try:
            spec = api["make_test_spec"](swebench_row(instance, image))
        except Exception as exc:  # swebench's own validation (an unknown eval_type, ...)
            raise ConfigError(f"{where}: swebench could not make its test spec: {type(exc).__name__}: {exc}") from None
        return cls(instance, spec, strip_test_patch_steps(spec.eval_script, instance.base_commit, where))

    def judge(self, log: str, patch: str) -> OfficialRun:
        """swebench's verdict on a test log (the eval script's whole output)."""
        api = _swebench()
        with tempfile.TemporaryDirectory(prefix="orchard-swebench-") as tmp:
            path = os.path.join(tmp, "test_output.txt")
            with open(path, "w", encoding="utf-8") as out:
                out.write(log)
            status_map, found = api["get_logs_eval"](self.test_spec, path)
            prediction = {
                "instance_id": self.instance.instance_id,
                "model_name_or_path": "orchard",
                "model_patch": patch,
            }
            report = api["get_eval_report"](self.test_spec, prediction, path, True)[self.instance.instance_id]
        exit_code = _EXIT_CODE.search(log)
        tests = {
            test: self.status_of(test, status_map)
            for test in (*self.instance.FAIL_TO_PASS, *self.instance.PASS_TO_PASS)
        }
        tests_status = report.get("tests_status") or {
            key: {"success": [], "failure": list(ids)}
            for key, ids in (("FAIL_TO_PASS", self.instance.FAIL_TO_PASS), ("PASS_TO_PASS", self.instance.PASS_TO_PASS))
        }
        graded = {"resolved": bool(report["resolved"]), "tests": tests, "tests_status": tests_status}
        return OfficialRun(dict(status_map), bool(found), int(exit_code.group(1)) if exit_code else None, graded)

    def status_of(self, test: str, status_map: dict[str, str]) -> str:
        """A listed test's status in swebench's status map, found the way its grader finds it."""
        resolve = _swebench()["resolve_case"]
        key = resolve(test, status_map) if resolve else (test if test in status_map else None)
        return status_map[key] if key is not None else "MISSING"


def strip_test_patch_steps(eval_script: str, base_commit: str, where: str = "") -> str:
    """The eval script without the steps that reset and apply the test patch (the recipe
    does that itself, stricter), with ``cd /testbed`` made ``cd "$ORCHARD_REPO"`` (the
    repository wherever the sandbox has it; /testbed in SWE-bench's images)."""
    script, applied = _APPLY_HEREDOC.subn("", eval_script)
    if applied != 1:
        raise ConfigError(
            f"{where}: swebench's eval script applies the test patch {applied} times, not once with "
            "`git apply ... <<'EOF'`: not a script this recipe can run"
        )
    script = re.sub(rf"^git checkout {re.escape(base_commit)}\b[^\n]*(?:\n|\Z)", "", script, flags=re.M)
    if START_MARK not in script or END_MARK not in script:
        raise ConfigError(f"{where}: swebench's eval script has no test output markers")
    return _CD_TESTBED.sub('cd "$ORCHARD_REPO"', script)

"""Scoring an SWE episode where the agent cannot reach: its patch, graded in a clean sandbox.

1. ``submission`` (in the agent's sandbox): the working tree's diff against
   ``base_commit``, tracked and new files, bytecode and caches excluded. It is the only
   thing that leaves the agent's sandbox, which is then destroyed with whatever the
   agent left running in it.
2. ``grade`` (in a fresh sandbox at ``base_commit``, set up as the agent's was): the
   patch is applied; in strict mode, changes to test configuration (``conftest.py``,
   pytest/tox settings, ``sitecustomize``) are reverted and flagged; every file the test
   patch touches is restored to its base version, the test patch applied (these three in
   one command, ``stage_script``), bytecode caches removed (and none written, so no
   cached ``.pyc`` can stand in for its source); the test command runs with its output
   in ``.git/`` and only the ``-rA`` short summary comes back.
3. Each FAIL_TO_PASS / PASS_TO_PASS id gets its status (``MISSING`` when pytest did not
   report it; ids SWE-bench stores cut at their first space are matched as its grader
   matches them, see ``status_of``); the instance is resolved when every one passed
   (PASSED or XFAIL, as SWE-bench counts them).

Two harnesses run and read the tests: ``PytestHarness`` (the recipe's own, pytest ``-rA``)
and ``OfficialTests`` (SWE-bench's eval script, log parser and report, through the
``swebench`` package: see swebench_harness.py).

A verifier failure is never a reward. ``prove_harness`` runs once per environment at
setup, before the agent acts: the test command must run on the base tree with the test
patch and every PASS_TO_PASS test must pass, else ``VerifierError``. After that proof,
a harness that does not run at grading time is the patch's doing (reward 0, flagged) --
unless the patch is empty, in which case nothing but the verifier can be at fault.
"""

from __future__ import annotations

import json
import re
import shlex
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio

from orchard_async import ExecResult, Reward, Sandbox, SandboxLost, VerifierError
from orchard_async.recipes.swe.formats import ProScripts
from orchard_async.recipes.swe.instances import Instance, patch_files
from orchard_async.recipes.swe.pytest_summary import SUMMARY_BANNER, parse_test_outcomes, worse
from orchard_async.recipes.swe.swebench_harness import Activation, OfficialHarness

PASSING = frozenset({"PASSED", "XFAIL"})
PRO_PASSING = frozenset({"PASSED"})
TEST_LOG = ".git/orchard-tests.log"
EVAL_SCRIPT = ".git/orchard-eval.sh"
RC_MARK = "@@ORCHARD_TEST_RC="
# Instances say `python -m pytest`; images with only python3 (Debian's) still run them.
PYTHON_FALLBACK = 'command -v python >/dev/null 2>&1 || python() { python3 "$@"; }'
PATCH_LIMIT = 256_000  # characters of the agent's patch kept in the trajectory
# Plugin autoload is the instance's business (its sandbox env, see task.py), not the test run's.
# The tree's bytecode is removed before each run (FRESH_BYTECODE) and none is written; the
# interpreter's own stays usable: a pycache prefix would recompile pytest on every run (+0.7 s).
TEST_ENV = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
    "COLUMNS": "200",
}
# pytest's exit codes that mean it ran the tests (0 all passed, 1 some failed, 2 interrupted,
# e.g. by a collection error). 3 internal error, 4 usage error, 5 nothing collected, and
# the shell's 126/127 (not executable / not found) mean there was no test run to judge.
HARNESS_RAN = frozenset({0, 1, 2})
NOT_FOUND = frozenset({126, 127})

# Never part of a patch: build products, caches, bytecode (the unchecked-hash .pyc trick).
EXCLUDED_PATHS = (
    ":(exclude,glob)**/__pycache__/**",
    ":(exclude,glob)**/*.pyc",
    ":(exclude,glob)**/*.pyo",
    ":(exclude,glob)**/.pytest_cache/**",
    ":(exclude,glob)**/*.egg-info/**",
    ":(exclude).orchard",
)
# Files that steer how tests run rather than what the code does. A patch touching them is
# flagged; in strict mode they are graded at their base version.
_TEST_CONFIG_NAMES = frozenset(
    {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "sitecustomize.py", "usercustomize.py", "noxfile.py"}
)
_SHARED_CONFIG = frozenset({"setup.cfg", "pyproject.toml"})  # test config only where they mention pytest/tox

# Git as the scorer runs it: no hooks, no fsmonitor, no external diff or textconv drivers,
# fixed prefixes, whatever the agent put in the repository's config.
GIT = (
    "git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c diff.external= -c diff.noprefix=false "
    "-c core.quotepath=true"
)

# Scoring's git commands must never reach a repository *around* the sandbox (the local
# adapter's directory may sit inside one) when the agent has removed its own .git.
REPO_GUARD = (
    '[ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ] || '
    '{ echo "the working directory is no longer the root of a git repository" >&2; exit 3; }'
)


def status_of(test: str, outcomes: dict[str, str], cut: dict[str, str] | None = None) -> str:
    """The status of a listed test id among pytest's reported node ids, matched as SWE-bench's
    grader matches them.

    SWE-bench's pytest parser keys each result by the node id up to its first whitespace,
    so its datasets store ids with spaces (``test_f[a b]``) cut there (``test_f[a``). An
    exact match wins; else reported ids cut at their first whitespace are compared (several
    that cut alike: the worse status, which is the later line in the summary, as SWE-bench
    keeps it); else, for an id cut inside its parameters (more ``[`` than ``]``), reported
    ids that start with it, when they agree on passing (swebench's ``_resolve_case``).
    ``MISSING`` when nothing matches. ``cut`` is ``cut_at_space(outcomes)``, when the caller
    looks up many ids."""
    if test in outcomes:
        return outcomes[test]
    if cut is None:
        cut = cut_at_space(outcomes)
    if test in cut:
        return cut[test]
    if test.count("[") > test.count("]"):
        matches = [status for key, status in cut.items() if key.startswith(test)]
        if matches and len({status in PASSING for status in matches}) == 1:
            return matches[0]
    return "MISSING"


def cut_at_space(outcomes: dict[str, str]) -> dict[str, str]:
    """Reported node ids as SWE-bench's parser keys them: up to the first whitespace."""
    cut: dict[str, str] = {}
    for nodeid, status in outcomes.items():
        key = nodeid.split(None, 1)[0]
        cut[key] = worse(cut.get(key), status)
    return cut


def passing_of(instance: Instance) -> frozenset[str]:
    """The statuses that count as passed: SWE-bench counts XFAIL too, SWE-bench Pro only PASSED."""
    return PRO_PASSING if instance.pro is not None else PASSING


def grade(instance: Instance, outcomes: dict[str, str]) -> dict[str, Any]:
    """Per-test results and the SWE-bench-style report for one instance."""
    cut = cut_at_space(outcomes)
    passing = passing_of(instance)
    tests = {test: status_of(test, outcomes, cut) for test in (*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS)}
    report = {}
    for key, ids in (("FAIL_TO_PASS", instance.FAIL_TO_PASS), ("PASS_TO_PASS", instance.PASS_TO_PASS)):
        report[key] = {
            "success": [t for t in ids if tests[t] in passing],
            "failure": [t for t in ids if tests[t] not in passing],
        }
    resolved = not report["FAIL_TO_PASS"]["failure"] and not report["PASS_TO_PASS"]["failure"]
    return {"resolved": resolved, "tests": tests, "tests_status": report}


def _infra(result: ExecResult, what: str) -> None:
    if result.reason.is_infra:
        raise SandboxLost(f"scoring, {what}: {result.error_text or result.reason.value}")


def test_config_files(patch: str) -> list[str]:
    """Files of ``patch`` that configure the test run rather than the code under test."""
    touched = []
    for path in patch_files(patch):
        name = path.rsplit("/", 1)[-1]
        if name in _TEST_CONFIG_NAMES or name.endswith(".pth"):
            touched.append(path)
        elif name in _SHARED_CONFIG and _hunks_mention(patch, path, ("pytest", "tox", "addopts", "testpaths")):
            touched.append(path)
    return touched


def _hunks_mention(patch: str, path: str, words: tuple[str, ...]) -> bool:
    """Does the part of ``patch`` for ``path`` add or remove a line naming one of ``words``?"""
    for section in re.split(r"(?m)^(?=diff --git )", patch):
        if section.split("\n", 1)[0].endswith(f" b/{path}"):
            changed = [line for line in section.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
            return any(word in line.lower() for line in changed for word in words)
    return False


async def submission(sandbox: Sandbox, base_commit: str, time_limit: float = 60.0) -> str:
    """The working tree's diff against the base commit, new files included, excluded
    paths left out. Raises RuntimeError when the agent left no repository to diff."""
    excluded = " ".join(shlex.quote(p) for p in EXCLUDED_PATHS)
    script = (
        f"{REPO_GUARD}\n{GIT} add -A -- . {excluded} && "
        f"{GIT} diff --cached --binary --no-color --no-ext-diff --no-textconv --src-prefix=a/ --dst-prefix=b/ "
        f"{base_commit} -- . {excluded}"
    )
    result = await sandbox.exec(script, timeout=time_limit)
    _infra(result, "reading the diff")
    if not result.ok:
        raise RuntimeError(f"git diff failed in the sandbox: {result.error_text.strip()[-1000:]}")
    if result.stdout_cut:
        raise RuntimeError(f"the patch is larger than the output cap ({result.stdout_cut} bytes dropped)")
    return result.text


def revert_script(base_commit: str, files: list[str]) -> str:
    """Shell that puts each file back to its base version, or removes it if it is new."""
    return "\n".join(["set -e", REPO_GUARD, *_revert_lines(base_commit, files)])


def _revert_lines(base_commit: str, files: list[str]) -> list[str]:
    lines = []
    for path in files:
        q = shlex.quote(path)
        lines.append(
            f"if git cat-file -e {base_commit}:{q} 2>/dev/null; then git checkout -q {base_commit} -- {q}; "
            f"else rm -rf -- {q}; fi"
        )
    return lines


# Every compiled file in the tree (cached or sourceless) goes: only the sources are judged.
FRESH_BYTECODE = (
    r"find . -path ./.git -prune -o \( -name __pycache__ -type d -prune -exec rm -rf {} + \)"
    r" -o \( -name '*.py[co]' -type f -exec rm -f {} + \) 2>/dev/null"
)


def test_run_script(test_command: str, activation: Activation | None = None) -> str:
    """Run the tests with fresh bytecode, output to the log; print the summary and exit code.
    The activation runs inside the logged subshell: when it fails, the log says why."""
    activate = activation.prefix if activation and activation.prefix else ":"
    return (
        f"{FRESH_BYTECODE}\n"
        f"( {activate} || exit 125\n{PYTHON_FALLBACK}\n{test_command}\n) > {TEST_LOG} 2>&1; rc=$?; "
        f"sed -n '/{SUMMARY_BANNER}/,$p' {TEST_LOG}; echo; echo '{RC_MARK}'$rc"
    )


def official_run_script() -> str:
    """Run SWE-bench's eval script (on stdin) with bash, as its harness does, output to the
    log; ``ORCHARD_REPO`` is the repository (the script's ``cd``)."""
    return (
        f"{FRESH_BYTECODE}\n"
        f"cat > {EVAL_SCRIPT} || exit 3\n"
        f'ORCHARD_REPO="$(pwd -P)" bash {EVAL_SCRIPT} > {TEST_LOG} 2>&1 </dev/null; rc=$?; '
        f"rm -f {EVAL_SCRIPT}; echo '{RC_MARK}'$rc"
    )


class TestRun:
    """One run of the tests: exit code, per-test outcomes, the verdict, and whether it ran."""

    def __init__(
        self,
        result: ExecResult,
        seconds: float,
        *,
        exit_code: int | None,
        outcomes: dict[str, str],
        graded: dict[str, Any],
        ran: bool,
        runner: str,
    ):
        self.result = result
        self.seconds = seconds
        self.exit_code = exit_code
        self.outcomes = outcomes
        self.graded = graded
        self.ran = ran  # did the harness run tests at all (whatever their outcome)?
        self.runner = runner

    def why_not(self) -> str:
        if self.result.reason.value == "timeout":
            return "the test command timed out"
        if self.exit_code is None:
            return f"the test command ended without an exit code ({self.result.reason.value})"
        if self.exit_code in NOT_FOUND:
            return f"the test runner was not found (exit {self.exit_code})"
        if self.exit_code == 125 and self.runner == "pytest":
            return "the environment's activation failed (exit 125)"
        if self.runner == "swebench":
            return f"swebench found no test run in the log (the test command's exit {self.exit_code})"
        if self.runner != "pytest":
            return f"the {self.runner} harness read no test outcomes (the test command's exit {self.exit_code})"
        if self.exit_code not in HARNESS_RAN:
            return f"pytest could not run the tests (exit {self.exit_code})"
        return "pytest reported no test outcomes"


def _exit_code(text: str) -> int | None:
    rc = re.search(re.escape(RC_MARK) + r"(\d+)\s*$", text)
    return int(rc.group(1)) if rc else None


class PytestHarness:
    """The recipe's own: the test command (pytest ``-rA``) after the activation; outcomes
    from the short summary, which is all that comes back from the sandbox."""

    name = "pytest"

    def __init__(self, test_command: str, activation: Activation | None = None):
        self.test_command = test_command
        self.activation = activation or Activation()

    @property
    def key(self) -> tuple:
        return ("pytest", self.test_command, self.activation.prefix)

    async def run(self, sandbox: Sandbox, instance: Instance, time_limit: float, patch: str = "") -> TestRun:
        mark = time.monotonic()
        result = await sandbox.exec(
            test_run_script(self.test_command, self.activation), env=TEST_ENV, timeout=time_limit
        )
        _infra(result, "running the tests")
        exit_code = _exit_code(result.text)
        outcomes = parse_test_outcomes(result.text)
        ran = exit_code in HARNESS_RAN and bool(outcomes)
        return TestRun(
            result,
            time.monotonic() - mark,
            exit_code=exit_code,
            outcomes=outcomes,
            graded=grade(instance, outcomes),
            ran=ran,
            runner=self.name,
        )


class OfficialTests:
    """SWE-bench's eval script, run with bash; its whole log comes back and swebench's parser
    and report judge it (swebench_harness.OfficialHarness)."""

    name = "swebench"

    def __init__(self, official: OfficialHarness, activation: Activation | None = None):
        self.official = official
        self.activation = activation or Activation()  # the eval script activates itself; kept for the env check

    @property
    def key(self) -> tuple:
        return self.official.key

    async def run(self, sandbox: Sandbox, instance: Instance, time_limit: float, patch: str = "") -> TestRun:
        mark = time.monotonic()
        result = await sandbox.exec(
            official_run_script(), stdin=self.official.script.encode(), env=TEST_ENV, timeout=time_limit
        )
        _infra(result, "running the tests")
        seconds = time.monotonic() - mark
        try:
            log = (await sandbox.read_file(TEST_LOG)).decode("utf-8", "replace")
        except SandboxLost:
            raise
        except Exception:  # no log: the script never ran (its exit code says why)
            log = ""
        judged = await anyio.to_thread.run_sync(self.official.judge, log, patch)
        script_rc = _exit_code(result.text)
        exit_code = judged.exit_code if judged.exit_code is not None else script_rc
        return TestRun(
            result,
            seconds,
            exit_code=exit_code,
            outcomes=judged.status_map,
            graded=judged.graded,
            ran=judged.found and exit_code not in NOT_FOUND,
            runner=self.name,
        )


def whole_log_script(test_command: str, activation: Activation | None = None) -> str:
    """Run the tests with fresh bytecode, their whole output to the log, the exit code printed."""
    activate = activation.prefix if activation and activation.prefix else ":"
    return (
        f"{FRESH_BYTECODE}\n"
        f"( {activate} || exit 125\n{PYTHON_FALLBACK}\n{test_command}\n) > {TEST_LOG} 2>&1 </dev/null; "
        f"echo '{RC_MARK}'$?"
    )


async def _read_log(sandbox: Sandbox, path: str) -> str:
    try:
        return (await sandbox.read_file(path)).decode("utf-8", "replace")
    except SandboxLost:
        raise
    except Exception:  # no log: the command never ran (its exit code says why)
        return ""


class LogParserTests:
    """A dataset's own test command, its whole log read by the parser the row names
    (swebench's parser functions, by name: SWE-rebench-V2's ``install_config.log_parser``,
    SWE-smith's pytest parser); FAIL_TO_PASS/PASS_TO_PASS decide."""

    name = "log-parser"

    def __init__(self, test_command: str, parser: str, activation: Activation | None = None):
        self.test_command = test_command
        self.parser = parser
        self.activation = activation or Activation()

    @property
    def key(self) -> tuple:
        return ("log-parser", self.test_command, self.parser, self.activation.prefix)

    async def run(self, sandbox: Sandbox, instance: Instance, time_limit: float, patch: str = "") -> TestRun:
        mark = time.monotonic()
        result = await sandbox.exec(
            whole_log_script(self.test_command, self.activation), env=TEST_ENV, timeout=time_limit
        )
        _infra(result, "running the tests")
        seconds = time.monotonic() - mark
        log = await _read_log(sandbox, TEST_LOG)
        parse = swebench_parser(self.parser)
        try:
            outcomes = {str(k): str(v) for k, v in parse(log, None).items()}
        except Exception as exc:  # the parser's own failure on this log: not the agent's
            raise VerifierError(
                f"{instance.instance_id}: log parser {self.parser} failed: {type(exc).__name__}: {exc}"
            ) from None
        exit_code = _exit_code(result.text)
        return TestRun(
            result,
            seconds,
            exit_code=exit_code,
            outcomes=outcomes,
            graded=grade(instance, outcomes),
            ran=bool(outcomes) and exit_code not in NOT_FOUND and exit_code != 125,
            runner=self.name,
        )


PRO_DIR = ".git/orchard-pro"


def pro_run_script(test_files: tuple[str, ...]) -> str:
    """SWE-bench Pro's evaluation steps after the patches: its run_script.sh on the selected
    test files (comma-joined, as its harness passes them), stdout and stderr apart, then its
    parser.py over both into output.json."""
    files = ",".join(test_files)
    return (
        f"{FRESH_BYTECODE}\n"
        f"bash {PRO_DIR}/run_script.sh '{files}' > {PRO_DIR}/stdout.log 2> {PRO_DIR}/stderr.log </dev/null\n"
        f"{PYTHON_FALLBACK}\n"
        f"python {PRO_DIR}/parser.py {PRO_DIR}/stdout.log {PRO_DIR}/stderr.log {PRO_DIR}/output.json "
        f"> {TEST_LOG} 2>&1; echo '{RC_MARK}'$?"
    )


class ProTests:
    """SWE-bench Pro's grading: the instance's run_script.sh and parser.py, run in the
    scoring sandbox; the verdict from the parser's output.json (every listed test PASSED)."""

    name = "swe-bench-pro"

    def __init__(self, scripts: ProScripts):
        self.scripts = scripts
        self.activation = Activation()  # the image's own environment (its Dockerfile's ENV)

    @property
    def key(self) -> tuple:
        return ("swe-bench-pro", self.scripts.run_script, self.scripts.parser, self.scripts.test_files)

    async def run(self, sandbox: Sandbox, instance: Instance, time_limit: float, patch: str = "") -> TestRun:
        mark = time.monotonic()
        placed = await sandbox.exec(f"mkdir -p {PRO_DIR}", timeout=30.0)
        _infra(placed, "placing the evaluation scripts")
        await sandbox.write_file(f"{PRO_DIR}/run_script.sh", self.scripts.run_script)
        await sandbox.write_file(f"{PRO_DIR}/parser.py", self.scripts.parser)
        result = await sandbox.exec(pro_run_script(self.scripts.test_files), env=TEST_ENV, timeout=time_limit)
        _infra(result, "running the tests")
        seconds = time.monotonic() - mark
        exit_code = _exit_code(result.text)
        outcomes: dict[str, str] = {}
        output = await _read_log(sandbox, f"{PRO_DIR}/output.json")
        if output:
            try:
                outcomes = {str(t["name"]): str(t["status"]) for t in json.loads(output)["tests"]}
            except (ValueError, KeyError, TypeError) as exc:
                detail = f"{instance.instance_id}: parser.py wrote an output.json without its tests: {exc}"
                raise VerifierError(detail) from None
        await sandbox.exec(f"cp {PRO_DIR}/stdout.log {TEST_LOG} 2>/dev/null; rm -rf {PRO_DIR}", timeout=30.0)
        return TestRun(
            result,
            seconds,
            exit_code=exit_code,
            outcomes=outcomes,
            graded=grade(instance, outcomes),
            ran=bool(outcomes) and exit_code == 0,
            runner=self.name,
        )


_VERBOSE_LINE = re.compile(r"^(\S+::\S.*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?:\s+\[\s*\d+%\])?\s*$")


def parse_pytest_verbose(log: str, test_spec: Any = None) -> dict[str, str]:
    """pytest ``--verbose`` lines (``tests/x.py::test_y PASSED [ 10%]``), as SWE-smith's
    Python profiles run and read their tests; the last status of a test wins."""
    outcomes: dict[str, str] = {}
    for line in log.splitlines():
        found = _VERBOSE_LINE.match(line.strip())
        if found:
            outcomes[found.group(1)] = found.group(2)
    return outcomes


# Log parsers of the datasets' own that swebench does not have, by the name rows give.
OWN_PARSERS: dict[str, Callable[[str, Any], dict[str, str]]] = {"pytest_verbose": parse_pytest_verbose}


def swebench_parser(name: str) -> Callable[[str, Any], dict[str, str]]:
    """The log parser of that name: one of the recipe's (OWN_PARSERS), else swebench's
    function; ConfigError when there is none."""
    if name in OWN_PARSERS:
        return OWN_PARSERS[name]
    from orchard_async.recipes.swe.swebench_harness import parser_by_name

    return parser_by_name(name)


Harness = PytestHarness | OfficialTests | LogParserTests | ProTests


async def run_tests(
    sandbox: Sandbox, harness: Harness, instance: Instance, time_limit: float, patch: str = ""
) -> TestRun:
    return await harness.run(sandbox, instance, time_limit, patch)


async def log_tail(sandbox: Sandbox, time_limit: float) -> str:
    tail = await sandbox.exec(f"tail -c 3000 {TEST_LOG}", timeout=time_limit)
    return tail.text if tail.ok else ""


def put_tests_in_place(instance: Instance, patch_on_stdin: str = "cat") -> str:
    """Shell that applies the test patch (read by ``patch_on_stdin``), or runs the command
    the row's format puts its tests in place with (SWE-bench Pro's last line of
    ``before_repo_set_cmd``)."""
    if instance.test_stage:
        return instance.test_stage
    if not instance.test_patch.strip():  # SWE-smith: the tests are in the instance's branch
        return ":"
    return f"{patch_on_stdin} | git apply --whitespace=nowarn -"


async def apply_test_patch(sandbox: Sandbox, instance: Instance, time_limit: float) -> None:
    """Restore the test patch's files to base, then apply it. Its failure is the verifier's."""
    script = revert_script(instance.base_commit, instance.test_files) + "\n" + put_tests_in_place(instance)
    applied = await sandbox.exec(script, stdin=instance.test_patch.encode(), timeout=time_limit)
    _infra(applied, "applying the test patch")
    if not applied.ok:
        raise VerifierError(
            f"{instance.instance_id}: the test patch did not apply: {applied.error_text.strip()[-500:]}"
        )


STAGE_MARK = "@@ORCHARD_STAGE="
STAGED_PATCHES = ".git/orchard-patches"


def stage_script(instance: Instance, agent_patch_bytes: int, revert: list[str]) -> str:
    """One command for what grading does before the tests: the agent's patch (the first
    ``agent_patch_bytes`` of stdin) applied, the ``revert`` files (test configuration, in
    strict mode) put back to base, the test patch's files restored and the test patch (the
    rest of stdin) applied. One round trip instead of three, and one repository check.
    Each stage prints its mark before it starts; ``set -e`` ends the script at the first
    failure, so the last mark names the stage that failed."""
    base = instance.base_commit
    lines = ["set -e", REPO_GUARD, f"cat > {STAGED_PATCHES}"]
    if agent_patch_bytes:
        lines += [
            f"echo {STAGE_MARK}agent_patch",
            f"head -c {agent_patch_bytes} {STAGED_PATCHES} | {GIT} apply --binary --whitespace=nowarn -",
        ]
    if revert:
        lines += [f"echo {STAGE_MARK}test_config", *_revert_lines(base, revert)]
    lines += [
        f"echo {STAGE_MARK}test_patch",
        *_revert_lines(base, instance.test_files),
        put_tests_in_place(instance, f"tail -c +{agent_patch_bytes + 1} {STAGED_PATCHES}"),
        f"echo {STAGE_MARK}done",
        f"rm -f {STAGED_PATCHES}",
    ]
    return "\n".join(lines)


def _failed_stage(result: ExecResult) -> str | None:
    marks = [line[len(STAGE_MARK) :] for line in result.text.splitlines() if line.startswith(STAGE_MARK)]
    return marks[-1] if marks else None


def _check_proof(instance: Instance, run: TestRun, tail: str) -> None:
    if not run.ran:
        raise VerifierError(f"{instance.instance_id}: {run.why_not()} on the base tree: {tail.strip()[-800:]}")
    maintained = set(run.graded["tests_status"]["PASS_TO_PASS"]["success"])
    broken = [t for t in instance.PASS_TO_PASS if t not in maintained]
    if broken:
        shown = ", ".join(f"{t} {run.graded['tests'].get(t, 'MISSING')}" for t in broken[:5])
        raise VerifierError(f"{instance.instance_id}: PASS_TO_PASS tests do not pass on the base tree: {shown}")


async def check_activation(sandbox: Sandbox, activation: Activation, time_limit: float) -> None:
    """The agent's commands (the sandbox's environment) and the recipe's (after the activation
    prefix) must find the same ``python``; else the agent would work in another environment
    than the one its tests run in."""
    if not activation.prefix:
        return
    probe = "command -v python || command -v python3 || true"
    plain = await sandbox.exec(probe, timeout=time_limit)
    activated = await sandbox.exec(f"{activation.prefix} >/dev/null 2>&1 || exit 125\n{probe}", timeout=time_limit)
    _infra(plain, "probing the environment")
    _infra(activated, "probing the activated environment")
    if not activated.ok:  # `||` catches a failing command; sh itself dies when `.` finds no file
        detail = activated.error_text.strip()[-300:]
        raise RuntimeError(f"the environment's activation failed: {activation.prefix}{': ' + detail if detail else ''}")
    if plain.text.strip() != activated.text.strip():
        raise RuntimeError(
            f"the agent's commands would run {plain.text.strip() or 'no python'}, the tests "
            f"{activated.text.strip() or 'no python'} (after {activation.prefix!r}): give the activated "
            "environment's variables (PATH, ...) in the instance's env"
        )


async def prove_harness(sandbox: Sandbox, instance: Instance, *, harness: Harness, time_limit: float) -> float:
    """Show the tests run on the base tree with the test patch and every PASS_TO_PASS test
    passes, leaving nothing of the hidden tests behind for the agent. Returns the seconds
    it took; raises VerifierError with the reason when it does not.

    The recipe's harness runs in a throwaway copy of the repository. SWE-bench's runs in
    place, as its eval script expects (its install step, e.g. ``pip install -e .``, must
    not point the environment at a copy), and the tree is then put back as it was."""
    start = time.monotonic()
    await check_activation(sandbox, harness.activation, min(60.0, time_limit))
    # A dataset's own scripts run where its image keeps the repository (they may `cd` there).
    if not isinstance(harness, PytestHarness) or instance.workdir is not None:
        await _prove_in_place(sandbox, instance, harness, time_limit)
        return time.monotonic() - start
    copy = f"/tmp/orchard-harness-proof-{uuid.uuid4().hex[:12]}"
    prepared = await sandbox.exec(f"rm -rf {copy} && cp -a . {copy}", timeout=time_limit)
    _infra(prepared, "copying the repository for the harness proof")
    if not prepared.ok:
        raise VerifierError(f"could not copy the repository to prove the test harness: {prepared.error_text.strip()}")
    try:
        await apply_test_patch(_At(sandbox, copy), instance, time_limit)
        run = await harness.run(_At(sandbox, copy), instance, time_limit)
        _check_proof(instance, run, "" if run.ran else await log_tail(_At(sandbox, copy), 10.0))
    finally:
        await sandbox.exec(f"rm -rf {copy}", timeout=30.0)
    return time.monotonic() - start


_STATUS = "git status --porcelain -z --untracked-files=normal"


def _status_entries(text: str) -> set[str]:
    return {entry for entry in text.split("\0") if entry.strip()}


async def _prove_in_place(sandbox: Sandbox, instance: Instance, harness: Harness, time_limit: float) -> None:
    """The proof where the repository is, then the tree put back: the test patch's files
    reverted, logs and caches removed, tracked files the run changed (an install step's
    doing) checked out again, untracked ones it made (build products) excluded from diffs
    like those the image came with (repo.EXCLUDE_UNTRACKED)."""
    before = await sandbox.exec(f"{REPO_GUARD}\n{_STATUS}", timeout=60.0)
    _infra(before, "reading the tree's state")
    try:
        await apply_test_patch(sandbox, instance, time_limit)
        run = await harness.run(sandbox, instance, time_limit)
        _check_proof(instance, run, "" if run.ran else await log_tail(sandbox, 10.0))
    finally:
        cleanup = (
            f"{revert_script(instance.base_commit, instance.test_files)}\n"
            f"rm -rf {TEST_LOG} {EVAL_SCRIPT} .pytest_cache .hypothesis\n{_STATUS}"
        )
        after = await sandbox.exec(cleanup, timeout=60.0)
        _infra(after, "putting the tree back after the harness proof")
    made = sorted(_status_entries(after.text) - _status_entries(before.text))
    tracked = [entry[3:] for entry in made if not entry.startswith("??")]
    untracked = [entry[3:] for entry in made if entry.startswith("??")]
    lines = [REPO_GUARD, "set -e"]
    lines += [f"git checkout -q HEAD -- {shlex.quote(path)}" for path in tracked]
    lines += [f"printf '/%s\\n' {shlex.quote(path)} >> .git/info/exclude" for path in untracked]
    lines.append(_STATUS)
    restored = await sandbox.exec("\n".join(lines), timeout=60.0)
    _infra(restored, "putting the tree back after the harness proof")
    left = sorted(_status_entries(restored.text) - _status_entries(before.text))
    if not after.ok or not restored.ok or left:
        detail = left[:5] or (after.error_text + restored.error_text).strip()[-300:]
        raise VerifierError(f"{instance.instance_id}: the test run changed the tree it ran in: {detail}")


class _At:
    """A sandbox whose commands run in another directory (the proof's copy)."""

    def __init__(self, sandbox: Sandbox, cwd: str):
        self._sandbox, self._cwd = sandbox, cwd

    async def exec(self, cmd: str, **kwargs: Any) -> ExecResult:
        # `cd` in the command, not exec's cwd: adapters only take a cwd inside the work dir.
        return await self._sandbox.exec(f"cd {shlex.quote(self._cwd)} || exit 3\n{cmd}", **kwargs)


async def score(
    sandbox: Sandbox, instance: Instance, patch: str, *, harness: Harness, budget: float, strict: bool = True
) -> Reward:
    """Grade ``patch`` in ``sandbox``, a clean checkout at ``base_commit``, within ``budget`` s."""
    start = time.monotonic()

    def left(reserve: float = 2.0) -> float:
        return max(1.0, budget - (time.monotonic() - start) - reserve)

    config_touched = test_config_files(patch)
    info: dict[str, Any] = {
        "instance_id": instance.instance_id,
        "patch": patch if len(patch) <= PATCH_LIMIT else patch[:PATCH_LIMIT],
        "patch_bytes": len(patch.encode()),
        "empty_patch": not patch.strip(),
        "strict": strict,
        "harness": harness.name,
    }
    if len(patch) > PATCH_LIMIT:
        info["patch_truncated"] = True
    if config_touched:
        info["test_config_touched"] = config_touched

    agent_patch = patch.encode() if patch.strip() else b""
    revert = config_touched if strict and agent_patch else []
    staged = await sandbox.exec(
        stage_script(instance, len(agent_patch), revert),
        stdin=agent_patch + instance.test_patch.encode(),
        timeout=min(60.0, left()),
    )
    _infra(staged, "applying the patches")
    if not staged.ok:
        failed = _failed_stage(staged)
        detail = staged.error_text.strip()
        if failed == "agent_patch":  # it came from `git diff` of the agent's own tree against this very base
            info.update(grade(instance, {}), error="the agent's patch did not apply to a clean base")
            info["detail"] = detail[-2000:]
            return Reward(value=0.0, success=False, info=info)
        if failed == "test_config":
            raise VerifierError(f"could not revert test configuration: {detail[-500:]}")
        if failed == "test_patch":
            raise VerifierError(f"{instance.instance_id}: the test patch did not apply: {detail[-500:]}")
        raise VerifierError(f"{instance.instance_id}: could not stage the patches in the scorer: {detail[-500:]}")
    if revert:
        info["test_config_reverted"] = True
    run = await run_tests(sandbox, harness, instance, left(reserve=5.0), patch)
    info["test_s"] = round(run.seconds, 3)
    info["test_exit_code"] = run.exit_code
    if run.result.reason.value == "timeout":
        info["test_timeout"] = True
    graded = run.graded
    info.update(graded)
    # swebench's own verdict on whether tests ran is its get_logs_eval (a fail-only eval type
    # counts tests it did not see as passing); pytest's summary names every test it ran.
    all_missing = run.runner != "swebench" and all(status == "MISSING" for status in graded["tests"].values())
    if not run.ran or all_missing or run.exit_code in NOT_FOUND:
        tail = await log_tail(sandbox, min(10.0, left(0.5)))
        if info["empty_patch"] or run.exit_code in NOT_FOUND:
            # The harness was proven on this very tree at setup: nothing of the agent's is here.
            raise VerifierError(f"{instance.instance_id}: {run.why_not()} when grading: {tail.strip()[-800:]}")
        info["harness_broken_by_patch"] = True
        info["test_output_tail"] = tail
    elif not graded["resolved"] and budget - (time.monotonic() - start) > 3.0:
        info["test_output_tail"] = await log_tail(sandbox, min(10.0, left(0.5)))
    resolved = bool(graded["resolved"])
    return Reward(value=1.0 if resolved else 0.0, success=resolved, info=info)

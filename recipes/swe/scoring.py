"""Scoring an SWE episode where the agent cannot reach: its patch, graded in a clean sandbox.

1. ``submission`` (in the agent's sandbox): the working tree's diff against
   ``base_commit``, tracked and new files, bytecode and caches excluded. It is the only
   thing that leaves the agent's sandbox, which is then destroyed with whatever the
   agent left running in it.
2. ``grade`` (in a fresh sandbox at ``base_commit``, set up as the agent's was): the
   patch is applied; in strict mode, changes to test configuration (``conftest.py``,
   pytest/tox settings, ``sitecustomize``) are reverted and flagged; every file the test
   patch touches is restored to its base version, the test patch applied, bytecode
   caches removed (and redirected, so no cached ``.pyc`` can stand in for its source);
   the test command runs with its output in ``.git/`` and only the ``-rA`` short
   summary comes back.
3. Each FAIL_TO_PASS / PASS_TO_PASS id gets its status (``MISSING`` when pytest did not
   report it); the instance is resolved when every one passed (PASSED or XFAIL, as
   SWE-bench counts them).

A verifier failure is never a reward. ``prove_harness`` runs once per environment at
setup, before the agent acts: the test command must run on the base tree with the test
patch and every PASS_TO_PASS test must pass, else ``VerifierError``. After that proof,
a harness that does not run at grading time is the patch's doing (reward 0, flagged) --
unless the patch is empty, in which case nothing but the verifier can be at fault.
"""

from __future__ import annotations

import re
import shlex
import time
import uuid
from typing import Any

from orchard_async import ExecResult, Reward, Sandbox, SandboxLost, VerifierError

from .instances import Instance, patch_files

SUMMARY_BANNER = "short test summary info"
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS)\s+(\S.*)$")
_WORSE = {"PASSED": 0, "XFAIL": 0, "XPASS": 1, "FAILED": 2, "ERROR": 3}
PASSING = frozenset({"PASSED", "XFAIL"})
TEST_LOG = ".git/orchard-tests.log"
RC_MARK = "@@ORCHARD_TEST_RC="
# Instances say `python -m pytest`; images with only python3 (Debian's) still run them.
PYTHON_FALLBACK = 'command -v python >/dev/null 2>&1 || python() { python3 "$@"; }'
PATCH_LIMIT = 256_000  # characters of the agent's patch kept in the trajectory
PYCACHE = "/tmp/orchard-pycache"  # bytecode goes here while grading, never next to the sources
TEST_ENV = {
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # third-party plugins must not change outcomes
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONPYCACHEPREFIX": PYCACHE,  # and no .pyc in the tree is ever read
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


def parse_test_outcomes(output: str) -> dict[str, str]:
    """Node id -> status from pytest's ``-rA`` short summary.

    Only lines after the "short test summary info" banner count; the node id is the
    text before the first `` - ``; a node reported twice (PASSED, then ERROR in
    teardown) keeps the worse status.
    """
    outcomes: dict[str, str] = {}
    in_summary = False
    for line in output.splitlines():
        if not in_summary:
            in_summary = SUMMARY_BANNER in line
            continue
        match = _SUMMARY_LINE.match(line)
        if not match:
            continue
        status, rest = match.groups()
        nodeid = rest.split(" - ", 1)[0].strip()
        if _WORSE[status] >= _WORSE.get(outcomes.get(nodeid, "PASSED"), 0):
            outcomes[nodeid] = status
    return outcomes


def grade(instance: Instance, outcomes: dict[str, str]) -> dict[str, Any]:
    """Per-test results and the SWE-bench-style report for one instance."""
    tests = {test: outcomes.get(test, "MISSING") for test in (*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS)}
    report = {}
    for key, ids in (("FAIL_TO_PASS", instance.FAIL_TO_PASS), ("PASS_TO_PASS", instance.PASS_TO_PASS)):
        report[key] = {
            "success": [t for t in ids if tests[t] in PASSING],
            "failure": [t for t in ids if tests[t] not in PASSING],
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
    lines = ["set -e", REPO_GUARD]
    for path in files:
        q = shlex.quote(path)
        lines.append(
            f"if git cat-file -e {base_commit}:{q} 2>/dev/null; then git checkout -q {base_commit} -- {q}; "
            f"else rm -rf -- {q}; fi"
        )
    return "\n".join(lines)


def test_run_script(test_command: str) -> str:
    """Run the tests with fresh bytecode, output to the log; print the summary and exit code."""
    return (
        f"find . -name __pycache__ -type d -prune -exec rm -rf {{}} + 2>/dev/null; rm -rf {PYCACHE}\n"
        f"( {PYTHON_FALLBACK}\n{test_command}\n) > {TEST_LOG} 2>&1; rc=$?; "
        f"sed -n '/{SUMMARY_BANNER}/,$p' {TEST_LOG}; echo; echo '{RC_MARK}'$rc"
    )


class TestRun:
    """One run of the test command: exit code, per-test outcomes, the command's reason."""

    def __init__(self, result: ExecResult, seconds: float):
        self.result = result
        self.seconds = seconds
        rc = re.search(re.escape(RC_MARK) + r"(\d+)\s*$", result.text)
        self.exit_code = int(rc.group(1)) if rc else None
        self.outcomes = parse_test_outcomes(result.text)

    @property
    def ran(self) -> bool:
        """Did the harness run tests at all (whatever their outcome)?"""
        return self.exit_code in HARNESS_RAN and bool(self.outcomes)

    def why_not(self) -> str:
        if self.result.reason.value == "timeout":
            return "the test command timed out"
        if self.exit_code is None:
            return f"the test command ended without an exit code ({self.result.reason.value})"
        if self.exit_code in NOT_FOUND:
            return f"the test runner was not found (exit {self.exit_code})"
        if self.exit_code not in HARNESS_RAN:
            return f"pytest could not run the tests (exit {self.exit_code})"
        return "pytest reported no test outcomes"


async def run_tests(sandbox: Sandbox, test_command: str, time_limit: float) -> TestRun:
    mark = time.monotonic()
    result = await sandbox.exec(test_run_script(test_command), env=TEST_ENV, timeout=time_limit)
    _infra(result, "running the tests")
    return TestRun(result, time.monotonic() - mark)


async def log_tail(sandbox: Sandbox, time_limit: float) -> str:
    tail = await sandbox.exec(f"tail -c 3000 {TEST_LOG}", timeout=time_limit)
    return tail.text if tail.ok else ""


async def apply_test_patch(sandbox: Sandbox, instance: Instance, time_limit: float) -> None:
    """Restore the test patch's files to base, then apply it. Its failure is the verifier's."""
    script = revert_script(instance.base_commit, instance.test_files) + "\ngit apply --whitespace=nowarn -"
    applied = await sandbox.exec(script, stdin=instance.test_patch.encode(), timeout=time_limit)
    _infra(applied, "applying the test patch")
    if not applied.ok:
        raise VerifierError(
            f"{instance.instance_id}: the test patch did not apply: {applied.error_text.strip()[-500:]}"
        )


async def prove_harness(sandbox: Sandbox, instance: Instance, *, test_command: str, time_limit: float) -> float:
    """Show the test command runs on the base tree with the test patch, in a throwaway
    copy of the repository (nothing of the hidden tests stays behind for the agent).
    Returns the seconds it took; raises VerifierError with the reason when it does not."""
    start = time.monotonic()
    copy = f"/tmp/orchard-harness-proof-{uuid.uuid4().hex[:12]}"
    prepared = await sandbox.exec(f"rm -rf {copy} && cp -a . {copy}", timeout=time_limit)
    _infra(prepared, "copying the repository for the harness proof")
    if not prepared.ok:
        raise VerifierError(f"could not copy the repository to prove the test harness: {prepared.error_text.strip()}")
    try:
        await apply_test_patch(_At(sandbox, copy), instance, time_limit)
        run = await run_tests(_At(sandbox, copy), test_command, time_limit)
        if not run.ran:
            tail = await log_tail(_At(sandbox, copy), 10.0)
            raise VerifierError(f"{instance.instance_id}: {run.why_not()} on the base tree: {tail.strip()[-800:]}")
        broken = [t for t in instance.PASS_TO_PASS if run.outcomes.get(t, "MISSING") not in PASSING]
        if broken:
            shown = ", ".join(f"{t} {run.outcomes.get(t, 'MISSING')}" for t in broken[:5])
            raise VerifierError(f"{instance.instance_id}: PASS_TO_PASS tests do not pass on the base tree: {shown}")
    finally:
        await sandbox.exec(f"rm -rf {copy} {PYCACHE}", timeout=30.0)
    return time.monotonic() - start


class _At:
    """A sandbox whose commands run in another directory (the proof's copy)."""

    def __init__(self, sandbox: Sandbox, cwd: str):
        self._sandbox, self._cwd = sandbox, cwd

    async def exec(self, cmd: str, **kwargs: Any) -> ExecResult:
        # `cd` in the command, not exec's cwd: adapters only take a cwd inside the work dir.
        return await self._sandbox.exec(f"cd {shlex.quote(self._cwd)} || exit 3\n{cmd}", **kwargs)


async def score(
    sandbox: Sandbox, instance: Instance, patch: str, *, test_command: str, budget: float, strict: bool = True
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
    }
    if len(patch) > PATCH_LIMIT:
        info["patch_truncated"] = True
    if config_touched:
        info["test_config_touched"] = config_touched

    if patch.strip():
        applied = await sandbox.exec(
            f"{REPO_GUARD}\n{GIT} apply --binary --whitespace=nowarn -", stdin=patch.encode(), timeout=min(60.0, left())
        )
        _infra(applied, "applying the agent's patch")
        if not applied.ok:  # it came from `git diff` of the agent's own tree against this very base
            info.update(grade(instance, {}), error="the agent's patch did not apply to a clean base")
            info["detail"] = applied.error_text.strip()[-2000:]
            return Reward(value=0.0, success=False, info=info)
        if strict and config_touched:
            reverted = await sandbox.exec(
                revert_script(instance.base_commit, config_touched), timeout=min(60.0, left())
            )
            _infra(reverted, "reverting test configuration")
            if not reverted.ok:
                raise VerifierError(f"could not revert test configuration: {reverted.error_text.strip()[-500:]}")
            info["test_config_reverted"] = True

    await apply_test_patch(sandbox, instance, min(60.0, left()))
    run = await run_tests(sandbox, test_command, left(reserve=5.0))
    info["test_s"] = round(run.seconds, 3)
    info["test_exit_code"] = run.exit_code
    if run.result.reason.value == "timeout":
        info["test_timeout"] = True
    graded = grade(instance, run.outcomes)
    info.update(graded)
    all_missing = all(status == "MISSING" for status in graded["tests"].values())
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

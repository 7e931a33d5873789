"""Scoring an SWE episode: the agent's diff, the hidden tests, per-test outcomes, ``resolved``.

After the agent finishes, in the same sandbox:

1. the patch is the working tree's diff against ``base_commit`` (new files included;
   ``__pycache__`` and friends are excluded by ``.git/info/exclude``);
2. every file the test patch touches is restored to its base version (or removed, if the
   test patch creates it), so the agent cannot pre-empt or break the hidden tests, and
   the test patch is applied;
3. the test command runs with its output in ``.git/``; only the ``-rA`` short summary
   comes back, so a huge log costs nothing;
4. each FAIL_TO_PASS / PASS_TO_PASS id gets its status (``MISSING`` when pytest did not
   report it), and the instance is resolved when every one of them passed (PASSED or
   XFAIL, as SWE-bench counts them).
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Any

from orchard_async import Reward, Sandbox, SandboxLost

from .instances import Instance

SUMMARY_BANNER = "short test summary info"
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS)\s+(\S.*)$")
_WORSE = {"PASSED": 0, "XFAIL": 0, "XPASS": 1, "FAILED": 2, "ERROR": 3}
PASSING = frozenset({"PASSED", "XFAIL"})
TEST_LOG = ".git/orchard-tests.log"
RC_MARK = "@@ORCHARD_TEST_RC="
# Instances say `python -m pytest`; images with only python3 (Debian's) still run them.
PYTHON_FALLBACK = "command -v python >/dev/null 2>&1 || python() { python3 \"$@\"; }"
PATCH_LIMIT = 256_000  # characters of the agent's patch kept in the trajectory
TEST_ENV = {
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # third-party plugins must not change outcomes
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
    "COLUMNS": "200",
}


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


def _infra(result: Any, what: str) -> None:
    if result.reason.is_infra:
        raise SandboxLost(f"scoring, {what}: {result.error_text or result.reason.value}")


async def agent_patch(sandbox: Sandbox, base_commit: str, time_limit: float = 60.0) -> str:
    """The working tree's diff against the base commit, new files included."""
    script = f"{REPO_GUARD}\ngit add -A && git diff --cached --binary --no-color --no-ext-diff {base_commit}"
    result = await sandbox.exec(script, timeout=time_limit)
    _infra(result, "reading the diff")
    if not result.ok:
        raise RuntimeError(f"git diff failed in the sandbox: {result.error_text.strip()[-1000:]}")
    return result.text


def restore_script(base_commit: str, files: list[str]) -> str:
    """Shell that puts each file back to its base version (or removes it), then applies stdin."""
    lines = ["set -e", REPO_GUARD]
    for path in files:
        q = shlex.quote(path)
        lines.append(
            f"if git cat-file -e {base_commit}:{q} 2>/dev/null; then git checkout -q {base_commit} -- {q}; "
            f"else rm -rf -- {q}; fi"
        )
    lines.append("git apply --whitespace=nowarn -")
    return "\n".join(lines)


async def score(sandbox: Sandbox, instance: Instance, *, test_command: str, budget: float) -> Reward:
    """Grade the sandbox's working tree within ``budget`` seconds."""
    start = time.monotonic()

    def left(reserve: float = 2.0) -> float:
        return max(1.0, budget - (time.monotonic() - start) - reserve)

    try:
        patch = await agent_patch(sandbox, instance.base_commit, time_limit=min(60.0, left()))
    except RuntimeError as exc:  # the agent broke the repository (deleted .git, ...): its own failure
        info = {"instance_id": instance.instance_id, **grade(instance, {}), "error": "no diff", "detail": str(exc)}
        return Reward(value=0.0, success=False, info=info)
    info: dict[str, Any] = {
        "instance_id": instance.instance_id,
        "patch": patch if len(patch) <= PATCH_LIMIT else patch[:PATCH_LIMIT],
        "patch_bytes": len(patch.encode()),
        "empty_patch": not patch.strip(),
    }
    if len(patch) > PATCH_LIMIT:
        info["patch_truncated"] = True

    applied = await sandbox.exec(
        restore_script(instance.base_commit, instance.test_files), stdin=instance.test_patch.encode(), timeout=min(60.0, left())
    )
    _infra(applied, "applying the test patch")
    if not applied.ok:
        info.update(grade(instance, {}))
        info.update(resolved=False, error="test_patch did not apply", detail=applied.error_text.strip()[-2000:])
        return Reward(value=0.0, success=False, info=info)

    mark = time.monotonic()
    run = (
        f"( {PYTHON_FALLBACK}\n{test_command}\n) > {TEST_LOG} 2>&1; rc=$?; "
        f"sed -n '/{SUMMARY_BANNER}/,$p' {TEST_LOG}; echo; echo '{RC_MARK}'$rc"
    )
    result = await sandbox.exec(run, env=TEST_ENV, timeout=left(reserve=5.0))
    _infra(result, "running the tests")
    info["test_s"] = round(time.monotonic() - mark, 3)
    output = result.text
    rc = re.search(re.escape(RC_MARK) + r"(\d+)\s*$", output)
    info["test_exit_code"] = int(rc.group(1)) if rc else None
    if result.reason.value == "timeout":
        info["test_timeout"] = True
    outcomes = parse_test_outcomes(output)
    graded = grade(instance, outcomes)
    info.update(graded)
    if not graded["resolved"] and budget - (time.monotonic() - start) > 3.0:
        tail = await sandbox.exec(f"tail -c 3000 {TEST_LOG}", timeout=min(10.0, left(0.5)))
        info["test_output_tail"] = tail.text if tail.ok else output[-3000:]
    resolved = bool(graded["resolved"])
    return Reward(value=1.0 if resolved else 0.0, success=resolved, info=info)

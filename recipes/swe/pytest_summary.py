"""Reading pytest's ``-rA`` short summary: node id -> status. Imports nothing of the package, so
the bundled task set's generator (``builtin/generator/gen.py``, run as a plain script too)
loads this file by its path and reads test runs by the same rule as the recipe's scorer."""

from __future__ import annotations

import re

SUMMARY_BANNER = "short test summary info"
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS)\s+(\S.*)$")
# "Worse" is the order pytest's -rA summary prints its sections in (PASSED first, FAILED
# last), so keeping the worse status gives what SWE-bench's parser keeps (the last line
# wins) on a real summary, and no line printed after the summary can turn a failure around.
_WORSE = {"PASSED": 0, "XFAIL": 1, "XPASS": 2, "ERROR": 3, "FAILED": 4}


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
        outcomes[nodeid] = worse(outcomes.get(nodeid), status)
    return outcomes


def worse(old: str | None, new: str) -> str:
    """The worse of two statuses (``new`` when there was none)."""
    return new if old is None or _WORSE[new] >= _WORSE[old] else old

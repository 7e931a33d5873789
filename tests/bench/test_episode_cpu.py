"""bench/episode_cpu.py: each of the SWE recipe's own scripts is counted under its phase (the
tool tells them apart by a piece of their text, so a recipe change could silently move CPU
from one row of the breakdown to another)."""

from __future__ import annotations

import pytest

from orchard_async.bench.episode_cpu import phase_of
from orchard_async.recipes.swe import load_tasks, repo, scoring
from orchard_async.recipes.swe.policies import gold_patch_command


class Captured(RuntimeError):
    pass


class Capture:
    """A sandbox that records the first command sent to it and fails it."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def exec(self, cmd, **kwargs):
        self.sent.append(cmd)
        raise Captured


@pytest.fixture(scope="module")
def task():
    return load_tasks("builtin")[0]


def test_scripts_fall_in_their_phase(task) -> None:
    inst = task.instance
    assert phase_of(scoring.stage_script(inst, 10, ["conftest.py"])) == "stage"
    assert phase_of(scoring.stage_script(inst, 0, [])) == "stage"
    assert phase_of(scoring.test_run_script(task.test_command, task.activation)) == "tests"
    assert phase_of(gold_patch_command(inst.patch)) == "agent"
    assert phase_of("git diff --stat") == "agent"
    assert phase_of("true") == "health"
    assert phase_of("echo true") == "other"  # only the warm pool's bare `true` is a health check


async def test_sent_scripts_fall_in_their_phase(task) -> None:
    """The scripts the recipe builds inside its calls, captured as they are sent."""
    cases = {
        "checkout": lambda box: repo.checkout(box, repo.RepoPack("0" * 40, b"p", b"i"), task.instance.base_commit, 9),
        "submission": lambda box: scoring.submission(box, task.instance.base_commit),
        "log_tail": lambda box: scoring.log_tail(box, 9),
        "proof": lambda box: scoring.apply_test_patch(
            scoring._At(box, "/tmp/orchard-harness-proof-x"), task.instance, 9
        ),
        "history": lambda box: repo.drop_history(box, 9),
    }
    for phase, call in cases.items():
        box = Capture()
        with pytest.raises(Captured):
            await call(box)
        assert [phase_of(cmd) for cmd in box.sent] == [phase], phase

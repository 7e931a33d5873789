"""Grading's patches go in as one command (scoring.stage_script): the agent's patch, the strict
revert, the test patch. Each failure must still be told apart as before: a patch of the
agent's that does not apply is the agent's (reward 0), a test patch that does not apply is
the verifier's (VerifierError, never a reward). Graded in a clean local sandbox, as the
episode loop grades."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from orchard_async import VerifierError
from orchard_async.adapters.local import LocalAdapter
from orchard_async.recipes import swe
from orchard_async.recipes.swe import scoring

INSTANCE = "minicalc__1"

# A second new file whose text is not ASCII: the patches are split on stdin by byte count.
NON_ASCII_FILE = (
    "diff --git a/NOTES.md b/NOTES.md\n"
    "new file mode 100644\n"
    "--- /dev/null\n"
    "+++ b/NOTES.md\n"
    "@@ -0,0 +1,2 @@\n"
    "+Exponentiation groups right: 2 ^ 3 ^ 2 = 2 ^ 9 — 512, not 64.\n"
    "+Ünïcödé so the byte count differs from the character count.\n"
)


async def _grade(tmp_path, patch: str, *, instance_changes: dict | None = None, strict: bool = True):
    task = swe.load_tasks(f"builtin:{INSTANCE}")[0]
    instance = dataclasses.replace(task.instance, **(instance_changes or {}))
    adapter = LocalAdapter(root=tmp_path / "sbx")
    try:
        sandbox = await adapter.create(task.spec)
        try:
            await task.prepare(sandbox)
            reward = await scoring.score(sandbox, instance, patch, harness=task.harness, budget=120.0, strict=strict)
            left = (await sandbox.exec(f"ls {scoring.STAGED_PATCHES} 2>/dev/null || true")).text.strip()
            return reward, left
        finally:
            await sandbox.close()
    finally:
        await adapter.close()


def test_the_gold_patch_with_non_ascii_text_resolves(tmp_path):
    task = swe.load_tasks(f"builtin:{INSTANCE}")[0]
    reward, left = anyio.run(_grade, tmp_path, task.instance.patch + NON_ASCII_FILE)
    assert reward.success and reward.info["resolved"], reward.info.get("test_output_tail")
    assert left == ""  # the staged patches are gone before the tests run


def test_an_agent_patch_that_does_not_apply_is_the_agents_failure(tmp_path):
    bogus = (
        "diff --git a/minicalc/parser.py b/minicalc/parser.py\n"
        "--- a/minicalc/parser.py\n+++ b/minicalc/parser.py\n"
        "@@ -1,1 +1,1 @@\n-this line is not in the file\n+nor is this one\n"
    )
    reward, _ = anyio.run(_grade, tmp_path, bogus)
    assert not reward.success and reward.value == 0.0
    assert reward.info["error"] == "the agent's patch did not apply to a clean base"
    assert "parser.py" in reward.info["detail"]
    assert set(reward.info["tests"].values()) == {"MISSING"}


def test_a_test_patch_that_does_not_apply_is_a_verifier_error(tmp_path):
    task = swe.load_tasks(f"builtin:{INSTANCE}")[0]
    broken = task.instance.test_patch.replace("\n-", "\n-NOT IN THE FILE ", 1)
    assert broken != task.instance.test_patch
    with pytest.raises(VerifierError, match="the test patch did not apply"):
        anyio.run(lambda: _grade(tmp_path, task.instance.patch, instance_changes={"test_patch": broken}))


def test_bench_splits_the_test_commands_time_out_of_score():
    """`bench episodes` shows the test command's own time (SWE's `test_s`) as `tests`, the
    rest of scoring as `score`; the shares still sum to 1. Tasks without it are unchanged."""
    from types import SimpleNamespace

    from orchard_async.bench.episodes import _with_test_share

    shares = {"create": 0.1, "setup": 0.2, "score": 0.7}
    finished = [
        SimpleNamespace(timings={"total": 1.0}, info={"test_s": 0.5}),
        SimpleNamespace(timings={"total": 1.0}, info={"test_s": 0.3}),
    ]
    split = _with_test_share(shares, finished)
    assert split["tests"] == pytest.approx(0.4) and split["score"] == pytest.approx(0.3)
    assert sum(split.values()) == pytest.approx(1.0)
    plain = [SimpleNamespace(timings={"total": 1.0}, info={})]
    assert _with_test_share(shares, plain) == shares

"""The Claw recipe on docker: the oracle passes and the empty policy scores 0 in containers
with network off, nothing is left behind. Needs a daemon and an image with python3
(ORCHARD_CLAW_IMAGE, default orchard/python:test here); skips without them (fails in CI)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async.recipes import claw
from tests.conftest import require_docker

try:
    from orchard_async.adapters.docker import DockerAdapter
except ImportError as exc:  # aiodocker is an optional dependency
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"docker: {exc}; pip install 'orchard-async[docker]'", allow_module_level=True)

IMAGE = os.environ.get("ORCHARD_CLAW_TEST_IMAGE", "orchard/python:test")
TASKS = "builtin:fault-mail-omar,safety-confirm-delete,docs-expense-totals,multiturn-schedule-lee"


@pytest.fixture(scope="module", autouse=True)
def docker_with_a_python_image() -> None:
    require_docker(IMAGE)


def test_oracle_passes_and_empty_scores_zero_on_docker() -> None:
    tasks = claw.load_tasks(TASKS, image=IMAGE)
    assert {t.spec.image for t in tasks} == {IMAGE} and {t.spec.network for t in tasks} == {"none"}

    async def main(policy: str) -> list[oa.Trajectory]:
        adapter = DockerAdapter(run_id=f"t{uuid.uuid4().hex[:10]}")
        try:
            found = [t async for t in oa.rollout(tasks, claw.make_policy(policy), adapter, concurrency=4)]
        finally:
            leaked = await adapter.list_owned()
            await adapter.close()
        assert leaked == []
        return found

    oracle = anyio.run(main, "oracle")
    assert [(t.task_id, t.reward) for t in oracle] == [(t.task_id, 1.0) for t in oracle], [
        (t.error, t.info) for t in oracle
    ]
    assert len(oracle) == 4
    empty = anyio.run(main, "empty")
    assert [t.reward for t in empty] == [0.0] * 4, [t.error for t in empty]


def test_claw_eval_task_folders_on_docker() -> None:
    """Claw-Eval's format (tests/recipes/claw_eval/tasks): its services on their declared ports inside
    containers with network off; oracle.sh scores 1.0, the empty policy 0.0, on every folder."""
    tasks = claw.load_tasks(f"claw-eval:{Path(__file__).parent / 'claw_eval' / 'tasks'}", image=IMAGE)
    assert len(tasks) == 8 and {t.spec.network for t in tasks} == {"none"}

    async def main(policy: str) -> list[oa.Trajectory]:
        adapter = DockerAdapter(run_id=f"t{uuid.uuid4().hex[:10]}")
        try:
            found = [t async for t in oa.rollout(tasks, claw.make_policy(policy), adapter, concurrency=4)]
        finally:
            leaked = await adapter.list_owned()
            await adapter.close()
        assert leaked == []
        return found

    oracle = anyio.run(main, "oracle")
    assert [(t.task_id, t.reward) for t in oracle] == [(t.task_id, 1.0) for t in oracle], [
        (t.task_id, t.error) for t in oracle if t.reward != 1.0
    ]
    assert len(oracle) == 8
    empty = anyio.run(main, "empty")
    assert [t.reward for t in empty] == [0.0] * 8, [t.error for t in empty]


# Whole recipes (or floors) on docker, 20-50 s each: left to `pytest -m soak` so the default run stays
# under 5 minutes on 2 cores; CI runs both.
pytestmark = pytest.mark.soak

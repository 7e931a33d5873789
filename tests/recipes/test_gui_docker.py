"""The GUI recipe on docker with the recipe's browser image: the oracle solves one task per
site, empty solves none, a replaced site server is caught, nothing is left behind. Needs a
daemon and the image `orchard-async images build` makes; skips without them (fails in CI)."""

from __future__ import annotations

import os
import uuid

import anyio
import pytest

import orchard_async as oa
from orchard_async.recipes import gui
from tests.conftest import require_docker
from tests.recipes.swe_support import ScriptPolicy
from tests.recipes.test_gui_browser import ONE_PER_SITE, REPLACE_SERVER

try:
    from orchard_async.adapters.docker import DockerAdapter
except ImportError as exc:  # aiodocker is an optional dependency
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"docker: {exc}; pip install 'orchard-async[docker]'", allow_module_level=True)

IMAGE = gui.IMAGES[0].tag


@pytest.fixture(scope="module", autouse=True)
def docker_with_the_browser_image() -> None:
    require_docker(IMAGE)


async def rollout_on_docker(tasks: list, policy: object) -> list[oa.Trajectory]:
    adapter = DockerAdapter(run_id=f"t{uuid.uuid4().hex[:10]}")  # the recipe names the image
    try:
        found = [t async for t in oa.rollout(tasks, policy, adapter, concurrency=3, max_retries=0)]
    finally:
        leaked = await adapter.list_owned()
        await adapter.close()
    assert leaked == []
    return sorted(found, key=lambda t: t.task_id)


def test_oracle_solves_empty_does_not_and_a_forged_server_is_caught_on_docker() -> None:
    tasks = gui.load_tasks(ONE_PER_SITE)
    assert {t.spec.image for t in tasks} == {IMAGE}
    oracle = anyio.run(rollout_on_docker, tasks, gui.make_policy("oracle"))
    assert [t.reward for t in oracle] == [1.0, 1.0, 1.0], [t.error or t.info for t in oracle]
    empty = anyio.run(rollout_on_docker, tasks, gui.make_policy("empty"))
    assert [(t.status, t.reward) for t in empty] == [("finished", 0.0)] * 3, [t.error for t in empty]
    (task,) = gui.load_tasks("builtin:shop-fleece-size")
    (forged,) = anyio.run(rollout_on_docker, [task], ScriptPolicy([REPLACE_SERVER], name="cheater"))
    assert forged.status == "finished" and forged.reward == 0.0 and forged.info["tampered"] == ["shop"]


def test_set_of_marks_observations_on_docker() -> None:
    (task,) = gui.load_tasks("builtin:shop-add-tote")
    task.marks = True
    (trajectory,) = anyio.run(rollout_on_docker, [task], gui.make_policy("oracle"))
    assert trajectory.reward == 1.0, trajectory.error or trajectory.info
    pages = [step.observation for step in trajectory.steps if step.action.kind == "exec"]
    assert pages and all("set-of-marks\n" in page and "\nmarks: " in page.split("\n---\n")[0] for page in pages)


# Whole recipes (or floors) on docker, 20-50 s each: left to `pytest -m soak` so the default run stays
# under 5 minutes on 2 cores; CI runs both.
pytestmark = pytest.mark.soak

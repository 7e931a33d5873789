"""The SWE recipe on docker with the recipe's own image: gold resolves, empty and every
cheating agent do not, nothing is left behind. Needs a daemon and the image that
`orchard-async images build` makes; skips without them (fails in CI)."""

from __future__ import annotations

import os
import uuid

import anyio
import pytest

import orchard_async as oa
from orchard_async.recipes import swe
from tests.conftest import require_docker
from tests.recipes.swe_support import ScriptPolicy
from tests.recipes.test_swe_cheaters import INSTANCE, cheats

try:
    from orchard_async.adapters.docker import DockerAdapter
except ImportError as exc:  # aiodocker is an optional dependency
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"docker: {exc}; pip install 'orchard-async[docker]'", allow_module_level=True)

IMAGE = swe.IMAGES[0].tag


@pytest.fixture(scope="module", autouse=True)
def docker_with_the_recipe_image() -> None:
    require_docker(IMAGE)


async def rollout_on_docker(tasks: list, policy: object, n: int | None = None) -> list[oa.Trajectory]:
    adapter = DockerAdapter(run_id=f"t{uuid.uuid4().hex[:10]}")  # the recipe names the image, not the adapter
    try:
        found = [t async for t in oa.rollout(tasks, policy, adapter, n=n, concurrency=4)]
    finally:
        leaked = await adapter.list_owned()
        await adapter.close()
    assert leaked == []
    return found


def test_gold_resolves_and_empty_does_not_on_docker() -> None:
    tasks = swe.load_tasks("builtin:minicalc__1,textkit__1")
    assert {t.spec.image for t in tasks} == {IMAGE}
    gold = anyio.run(rollout_on_docker, tasks, swe.make_policy("oracle"))
    assert [t.success for t in gold] == [True, True], [t.error or t.info.get("tests") for t in gold]
    empty = anyio.run(rollout_on_docker, tasks, swe.make_policy("empty"))
    assert [(t.status, t.success) for t in empty] == [("finished", False)] * 2, [t.error for t in empty]


@pytest.mark.parametrize(
    "cheat", ["edit_hidden_tests", "delete_tests", "conftest_hook", "pyc_trick", "background_writer"]
)
def test_cheat_is_unresolved_on_docker(cheat: str) -> None:
    (task,) = swe.load_tasks(f"builtin:{INSTANCE}")
    (trajectory,) = anyio.run(rollout_on_docker, [task], ScriptPolicy(cheats(task.instance)[cheat], name=cheat))
    assert trajectory.status == "finished", trajectory.error
    assert trajectory.reward == 0.0 and not trajectory.success, trajectory.info.get("tests")
    assert ("test_config_touched" in trajectory.info) == (cheat == "conftest_hook")

"""``OrchardEnvironment``, TRL's ``environment_factory`` shape: TRL's conventions (a ``reset``,
a ``get_reward``, public methods as tools whose schema transformers reads from their
docstrings), an episode on local played through its tools, and an episode whose sandbox could
not be made: unscorable (None), never a reward."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from tests.trainers.conftest import require
from tests.trainers.tasks import FailingCreates, task_of_row

pytestmark = pytest.mark.soak  # TRL's and transformers' imports alone take seconds


@pytest.fixture(autouse=True)
def _trl() -> None:
    require("trl", "transformers")


def test_the_environment_plays_an_episode_through_its_tools(tmp_path: Path) -> None:
    from transformers.utils import get_json_schema

    from orchard_async.adapters.local import LocalAdapter
    from orchard_async.trainers import EpisodeRunner
    from orchard_async.trainers.trl_rollout import OrchardEnvironment

    adapter = FailingCreates(LocalAdapter(root=tmp_path), "echo/g0/s0")  # the first episode's create fails
    with EpisodeRunner(adapter) as runner:
        factory = OrchardEnvironment.factory(runner, lambda row: task_of_row(**row))
        env = factory()
        # What TRL's GRPOTrainer reads off the class: reset, get_reward, and the tools.
        members = dict(inspect.getmembers(type(env), predicate=inspect.isfunction))
        tools = sorted(name for name in members if not name.startswith("_") and name not in ("reset", "get_reward"))
        assert {"reset", "get_reward"} <= set(members) and tools == ["bash", "submit"]
        assert get_json_schema(env.bash)["function"]["parameters"]["required"] == ["command"]
        assert env.reset() is None  # TRL's probe at construction starts nothing

        assert "could not start (create_failed)" in env.reset(prompt="p", extra_info={"task": "echo"})
        assert env.get_reward() is None, "an infrastructure failure is unscorable, never a reward"

        assert env.reset(prompt="p", extra_info={"task": "echo"}) == "Say something."
        assert env.bash("printf %s 13 > size; echo done").strip() == "done"
        assert env.get_reward() == pytest.approx((13 % 7) / 6)  # submitted now, judged on what it left
        assert env.bash("true") == "the episode has ended"

"""skyrl-gym's environment contract: ``orchard_async`` is registered with skyrl-gym, built by
its ``make``, and plays an orchard-async episode on local through ``init``/``step``/``close``;
the reward comes with the step that ends it, and an episode whose sandbox could not be made
ends untrainable (``metadata``), never rewarded."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainers.conftest import require
from tests.trainers.tasks import FailingCreates


@pytest.fixture(autouse=True)
def _skyrl() -> None:
    require("skyrl_gym")


def test_skyrl_gym_makes_and_steps_an_orchard_episode(tmp_path: Path) -> None:
    import skyrl_gym
    from skyrl_gym.envs.base_text_env import BaseTextEnv

    from orchard_async.adapters.local import LocalAdapter
    from orchard_async.trainers import skyrl_env

    config = {
        "task_of": "tests.trainers.tasks:task_of_row",
        "parse_reply": "tests.trainers.tasks:reply_command",
        "adapter": "local",
        "adapter_options": {"root": str(tmp_path / "sandboxes")},
    }
    env = skyrl_gym.make("orchard_async", env_config=config, extras={"extra_info": {"task": "echo"}})
    assert isinstance(env, BaseTextEnv) and isinstance(env, skyrl_env.OrchardTextEnv) and env.max_turns == 2
    conversation, metadata = env.init([{"role": "system", "content": "Be brief."}])
    assert conversation[-1] == {"role": "user", "content": "Say something."} and metadata == {}
    first = env.step("hello")
    assert not first["done"] and first["observations"][0]["role"] == "user" and first["reward"] == 0.0
    last = env.step("a reply of 24 characters")  # the task's last step: the episode is scored
    assert last["done"] and last["metadata"] == {"orchard_trainable": True, "orchard_end_reason": "max_steps"}
    assert last["reward"] == pytest.approx((24 % 7) / 6)
    env.close()

    # An infrastructure failure ends it at once, untrainable and unrewarded.
    adapter = FailingCreates(LocalAdapter(root=tmp_path / "failing"), "echo/g0/s0")
    broken = skyrl_gym.make(
        "orchard_async",
        env_config={**config, "adapter": adapter},
        extras={"extra_info": {"task": "echo"}},
    )
    _, metadata = broken.init([])
    assert metadata == {"orchard_trainable": False, "orchard_end_reason": "create_failed"}
    ended = broken.step("anything")
    assert ended["done"] and ended["reward"] == 0.0 and ended["metadata"]["orchard_trainable"] is False
    broken.close()


def test_an_environment_closed_mid_episode_aborts_it(tmp_path: Path) -> None:
    import skyrl_gym

    import orchard_async.trainers.skyrl_env  # noqa: F401 - registers the environment

    config = {
        "task_of": "tests.trainers.tasks:task_of_row",
        "parse_reply": "tests.trainers.tasks:reply_command",
        "adapter_options": {"root": str(tmp_path / "sandboxes")},
    }
    env = skyrl_gym.make("orchard_async", env_config=config, extras={})
    env.init([])
    env.close()
    assert env.episode is not None and env.episode.trajectory is not None
    assert env.episode.trajectory.end_reason == "aborted"

"""SkyRL: a skyrl-gym text environment (``BaseTextEnv``: ``init``, ``step``, ``close``) that
plays an orchard-async episode, registered with skyrl-gym as ``orchard_async`` so
``skyrl_gym.make("orchard_async", env_config=..., extras=...)`` builds it
(``pip install -e '.[trainers]'``; skyrl-gym 0.4).

The trainer's generator samples the model; each ``step(reply)`` is one action of the episode
(the reply parsed by ``parse_reply``, by default the bash-block protocol), run through the
whole engine (the task's setup, deadline, sandbox lifetime and scoring) on an event loop of
the environment's own (``EpisodeRunner``). ``env_config``: ``task_of`` (``module:attribute``:
the row's ``extras`` -> a Task), optionally ``parse_reply`` and ``messages_of`` (the recipe's
chat builder, for the first conversation), ``adapter`` (a name) and ``adapter_options``.

The episode's reward comes with the step that ends it. An episode that was not judged (an
infrastructure failure, an abort, its own error) is never a reward: that step says
``reward`` 0.0 (skyrl-gym's type is a float) and ``metadata["orchard_trainable"]`` False with
the end reason, which the trainer's generator must use to drop or mask the sample. Not
retried mid-episode: the model's turns cannot be replayed in a fresh sandbox.

SkyRL's own generator (skyrl-train) is not covered: it needs Python 3.12 and a CUDA build
of torch (docs/trainers.md).
"""

from __future__ import annotations

from typing import Any

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import registry

from orchard_async.errors import ConfigError
from orchard_async.models.tokens.policy import bash_reply
from orchard_async.records.trajectory import episode_so_far
from orchard_async.trainers import BridgedEpisode, EpisodeRunner, Turn, resolve

ENV_ID = "orchard_async"
_RUNNERS: dict[str, EpisodeRunner] = {}  # one per adapter (and options) in a process, shared by its envs


def runner_for(adapter: Any, options: dict[str, Any]) -> EpisodeRunner:
    if not isinstance(adapter, str):
        key = f"object:{id(adapter)}"
        if key not in _RUNNERS:
            _RUNNERS[key] = EpisodeRunner(adapter, max_retries=0)
        return _RUNNERS[key]
    key = f"{adapter}:{sorted(options.items())}"
    if key not in _RUNNERS:
        from orchard_async.runtime import get_adapter  # the registry: only when an env is made

        _RUNNERS[key] = EpisodeRunner(get_adapter(adapter, **options), max_retries=0)
    return _RUNNERS[key]


class OrchardTextEnv(BaseTextEnv):
    """One orchard-async episode per environment (see the module docstring)."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None):
        super().__init__()
        config = dict(env_config or {})
        self.extras = dict(extras or {})
        if "task_of" not in config:
            raise ConfigError("the orchard_async environment needs env_config.task_of (module:attribute)")
        self.task = resolve(config["task_of"], "task_of")(**self.extras)
        self.parse_reply = resolve(config.get("parse_reply") or bash_reply, "parse_reply")
        messages_of = config.get("messages_of")
        self.messages_of = resolve(messages_of, "messages_of") if messages_of else None
        self.runner = runner_for(config.get("adapter", "local"), dict(config.get("adapter_options") or {}))
        self.max_turns = self.task.max_steps
        self.episode: BridgedEpisode | None = None
        self.ended: Turn | None = None

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Create the sandbox and set the task up: the first conversation (the recipe's chat
        when ``messages_of`` is given, else the prompt then the task's instruction)."""
        self.episode = BridgedEpisode(self.runner, self.task, episode_id=f"skyrl-{id(self)}")
        turn = self.episode.start()
        if turn.done:  # the episode could not start: the first step ends it
            self.ended = turn
            return list(prompt), {"orchard_trainable": False, "orchard_end_reason": turn.end_reason}
        if self.messages_of is not None:
            started = episode_so_far(self.episode.episode_id, turn.observation, task_id=self.task.id, policy="skyrl")
            return self.messages_of(started), {}
        return [*prompt, {"role": "user", "content": turn.observation}], {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        if self.ended is None and self.episode is not None:
            turn = self.episode.step(self.parse_reply(action))
            if not turn.done:
                return BaseTextEnvStepOutput(
                    observations=[{"role": "user", "content": turn.observation}],
                    reward=0.0,
                    done=False,
                    metadata={},
                )
            self.ended = turn
        ended = self.ended or Turn(done=True)
        reward = ended.reward
        return BaseTextEnvStepOutput(
            observations=[],
            reward=reward if reward is not None else 0.0,
            done=True,
            metadata={"orchard_trainable": reward is not None, "orchard_end_reason": ended.end_reason},
        )

    def close(self) -> None:
        if self.episode is not None:
            self.episode.close()


def register() -> None:
    """Register the environment with skyrl-gym as ``orchard_async`` (once)."""
    if ENV_ID not in registry:
        skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:OrchardTextEnv")


register()

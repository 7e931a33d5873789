"""TRL's ``GRPOTrainer``: a ``rollout_func`` whose rollouts are orchard-async episodes, and an
``environment_factory`` class (``pip install -e '.[trainers]'``; TRL 1.16's interfaces).

``rollout_func(prompts, trainer)``: TRL hands over the batch's prompts, each repeated
``num_generations`` times in a row (its ``RepeatSampler``); each run of equal prompts becomes
one group of episodes of the prompt's task (``task_of(prompt)``), played by a token policy
sampling with the trainer's own model (``TrainerModelEngine``, weight version = the
trainer's global step). It returns what TRL asks for: ``prompt_ids``, ``completion_ids``
(every turn's sampled tokens and the observations' tokens between them), ``logprobs`` (the
sampler's, 0.0 on observation tokens), ``env_mask`` (1 on sampled tokens), and the fields
TRL forwards to reward functions: ``orchard_reward`` and ``orchard_end_reason``.

Infrastructure outcomes and the episode's own failures are never a reward: such a sample's
``env_mask`` is all 0 (no token of it is trained on) and ``orchard_reward`` (the reward
function of the same name returns it) is None, which TRL takes as unscorable: left out of
its group's baseline, advantage 0.

``OrchardEnvironment`` is TRL's other shape: an ``environment_factory`` class whose ``bash``
and ``submit`` methods TRL offers the model as tools, ``reset(**row)`` starting an episode
of the row's task and ``get_reward()`` its reward (None when it was not judged).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from orchard_async.errors import ConfigError
from orchard_async.models.tokens import Sampling
from orchard_async.models.tokens.local import TransformersEngine
from orchard_async.models.tokens.policy import MessagesOf, ParseReply, TokenPolicy, bash_reply
from orchard_async.protocols import Adapter, Task
from orchard_async.records.trajectory import Action
from orchard_async.trainers import BridgedEpisode, EpisodeRunner, Turn, group_runs, training_sample

TaskOf = Callable[[Any], Task]


class TrainerModelEngine(TransformersEngine):
    """The transformers engine over a model object (the one a trainer is training), its
    weight version read from ``version()`` at each generation."""

    def __init__(self, model: Any, version: Callable[[], str], *, seed: int = 0):
        import torch

        self.model = model
        self.name = f"trainer:{type(model).__name__}"
        self.torch = torch
        self.generator = torch.Generator().manual_seed(seed)
        self.context = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = getattr(model.config, "eos_token_id", None)
        self.end_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        import inspect
        import threading

        self._lock = threading.Lock()
        self._cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._version = version

    @property
    def weight_version(self) -> str:
        return self._version()

    @weight_version.setter
    def weight_version(self, value: str) -> None:  # the parent's __init__ would set it; ours reads it live
        pass


def prompt_text(prompt: Any) -> str:
    """A TRL prompt as text: a string, or a conversation's last message's content."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and prompt and isinstance(prompt[-1], dict):
        return str(prompt[-1].get("content", ""))
    raise ConfigError(f"a TRL prompt is a string or a list of messages, got {type(prompt).__name__}")


class OrchardRolloutFunc:
    """``GRPOTrainer(rollout_func=OrchardRolloutFunc(...))`` (see the module docstring).

    ``task_of(prompt)``: the task a prompt stands for; ``messages_of``/``parse_reply``: the
    recipe's chat builder and reply parser the token policy uses (a recipe's
    ``training_chats(...).messages_of`` and ``parse_reply``); ``runner``: where episodes run
    (an ``EpisodeRunner`` over an adapter, or an adapter: one is made)."""

    def __init__(
        self,
        runner: EpisodeRunner | Adapter,
        task_of: TaskOf,
        *,
        messages_of: MessagesOf,
        parse_reply: ParseReply = bash_reply,
        sampling: Sampling | None = None,
    ):
        self.runner = runner if isinstance(runner, EpisodeRunner) else EpisodeRunner(runner)
        self.task_of = task_of
        self.messages_of = messages_of
        self.parse_reply = parse_reply
        self.sampling = sampling or Sampling(max_tokens=32)
        self.last: list[Any] = []  # the samples of the last batch, for a trainer's logs and the tests

    def policy(self, trainer: Any) -> TokenPolicy:
        engine = TrainerModelEngine(trainer.model, lambda: str(trainer.state.global_step))
        return TokenPolicy(
            engine, trainer.processing_class, self.messages_of, parse_reply=self.parse_reply, sampling=self.sampling
        )

    def placeholder(self, prompt: Any, tokenizer: Any) -> list[int]:
        ids = list(tokenizer(prompt_text(prompt), add_special_tokens=False)["input_ids"])
        return ids or [tokenizer.eos_token_id]

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        size = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        if not group_runs(prompts, size):
            size = 1  # not a GRPO batch of repeats: each prompt a group of its own
        heads = prompts[::size]
        trajectories = self.runner.run([self.task_of(p) for p in heads], self.policy(trainer), group_size=size)
        tokenizer = trainer.processing_class
        samples = [
            training_sample(trajectory, self.placeholder(prompt, tokenizer))
            for trajectory, prompt in zip(trajectories, prompts, strict=True)
        ]
        self.last = samples
        return {
            "prompt_ids": [s.prompt_ids for s in samples],
            "completion_ids": [s.response_ids for s in samples],
            "logprobs": [s.response_logprobs for s in samples],
            "env_mask": [s.response_mask if s.trainable else [0] * len(s.response_ids) for s in samples],
            "orchard_reward": [s.reward for s in samples],
            "orchard_end_reason": [s.end_reason for s in samples],
        }

    def close(self) -> None:
        self.runner.close()


def orchard_reward(completions: list[Any], orchard_reward: list[float | None], **kwargs: Any) -> list[float | None]:
    """The reward function to pass with ``OrchardRolloutFunc``: each episode's reward, None
    where it was not judged (TRL leaves such a sample out of its group, advantage 0)."""
    return list(orchard_reward)


class OrchardEnvironment:
    """An ``environment_factory`` class for TRL: one episode per ``reset``. Make it with
    ``OrchardEnvironment.factory(runner, task_of)``; TRL offers ``bash`` and ``submit`` to
    the model as tools and reads ``get_reward``."""

    # Private names: TRL offers every public function of the class to the model as a tool.
    _runner: EpisodeRunner
    _task_of: TaskOf

    @classmethod
    def factory(cls, runner: EpisodeRunner, task_of: TaskOf) -> Callable[[], OrchardEnvironment]:
        bound = type(cls.__name__, (cls,), {"_runner": runner, "_task_of": staticmethod(task_of)})
        return bound

    def __init__(self) -> None:
        self.episode: BridgedEpisode | None = None
        self.ended: Turn | None = None
        self.count = 0

    def reset(self, **row: Any) -> str | None:
        """Start an episode of the row's task (``task_of(row)``); its instruction."""
        if self.episode is not None:
            self.episode.close()
        self.ended = None
        if not row:  # TRL's probe at construction: no episode yet
            self.episode = None
            return None
        self.count += 1
        self.episode = BridgedEpisode(self._runner, self._task_of(row), episode_id=f"trl-env-{id(self)}-{self.count}")
        turn = self.episode.start()
        if turn.done:
            self.ended = turn
            return f"the environment could not start ({turn.end_reason})"
        return turn.observation

    def bash(self, command: str) -> str:
        """Run a shell command in the task's sandbox and return its output.

        Args:
            command: The shell command to run.

        Returns:
            The command's output (stdout, then stderr, then the exit status if it failed).
        """
        return self._act(Action(command=command))

    def submit(self) -> str:
        """Say the task is done; the sandbox is then graded.

        Returns:
            A note that the episode ended.
        """
        return self._act(Action(kind="submit"))

    def _act(self, action: Action) -> str:
        if self.ended is not None or self.episode is None:
            return "the episode has ended"
        turn = self.episode.step(action)
        if turn.done:
            self.ended = turn
            return f"the episode ended ({turn.end_reason})"
        return turn.observation

    def get_reward(self) -> float | None:
        """The episode's reward, None unless the scorer judged it (an episode the model never
        submitted is submitted now and judged on what it left)."""
        if self.episode is None:
            return None
        if self.ended is None:
            self._act(Action(kind="submit"))
        return self.ended.reward if self.ended is not None else None

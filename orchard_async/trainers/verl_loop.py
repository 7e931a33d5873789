"""verl: an agent loop (registered as ``orchard_async``) that plays one orchard-async episode
per dataset row and returns verl's own ``AgentLoopOutput`` (``pip install -e '.[trainers]'``;
verl 0.9's ``verl.experimental.agent_loop`` interfaces).

Select it with ``agent_name: orchard_async`` in the dataset, and say where its parts come
from in the agent loop config (``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

    - name: orchard_async
      _target_: orchard_async.trainers.verl_loop.OrchardAgentLoop
      task_of: my_project.tasks:task_of          # dataset row (kwargs) -> orchard_async Task
      messages_of: my_project.tasks:messages_of  # the recipe's chat builder
      parse_reply: my_project.tasks:parse_reply  # optional: the bash-block protocol by default
      adapter: local                             # an adapter name (or an Adapter object)

The episode samples through verl's own server manager (``VerlServerEngine``: the prompt ids
each turn, verl's ``sampling_params``; its ``max_global_steps`` is the turn's weight
version), so verl's weight syncs and load balancing hold. The output is the token policy's
one sequence: ``prompt_ids``, ``response_ids`` (sampled tokens mask 1, observation tokens
mask 0), ``response_logprobs``, ``reward_score`` (the episode's), ``num_turns``.

An episode that was not judged (an infrastructure failure, an abort, its own error) is never
a reward: its ``response_mask`` is all 0 (no token of it trains) and ``extra_fields`` says
``orchard_trainable: False`` with the end reason. verl's GRPO still counts each sample's
score in its group's baseline, so its ``reward_score`` is 0.0 there; the advantage estimator
registered here as ``orchard_grpo`` (``algorithm.adv_estimator: orchard_grpo``) is GRPO with
such samples left out of their group's mean and std.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any
from uuid import uuid4

import numpy as np
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.trainer.ppo.core_algos import register_adv_est

from orchard_async.engine.plan import plan
from orchard_async.engine.pool import Pool
from orchard_async.engine.rollout import run_with_retries
from orchard_async.errors import ConfigError
from orchard_async.models.tokens import Generation, GenerationAborted, Sampling
from orchard_async.models.tokens.policy import TokenPolicy, bash_reply
from orchard_async.protocols import Adapter
from orchard_async.trainers import resolve, training_sample

AGENT_NAME = "orchard_async"
_POOLS: dict[str, Pool] = {}  # one pool per adapter (and options) in a worker process, shared by its loops


class VerlServerEngine:
    """A token engine over verl's server manager (``LLMServerClient.generate``)."""

    def __init__(self, server_manager: Any, sampling_params: dict[str, Any], request_id: str):
        self.server_manager = server_manager
        self.sampling_params = sampling_params
        self.request_id = request_id  # sticky: every turn of the episode goes to the same server
        self.name = "verl"
        self.weight_version = ""
        self.global_steps: list[int] = []

    async def generate(self, input_ids: Sequence[int], sampling: Sampling) -> Generation:
        output = await self.server_manager.generate(
            request_id=self.request_id, prompt_ids=list(input_ids), sampling_params=dict(self.sampling_params)
        )
        if output.stop_reason == "aborted":
            raise GenerationAborted("verl's rollout server aborted the generation")
        if output.log_probs is None:
            raise ConfigError(
                "verl's rollout returned no logprobs: set actor_rollout_ref.rollout.calculate_log_probs=True"
            )
        steps = output.extra_fields.get("max_global_steps")
        if steps is not None:
            self.global_steps.append(int(steps))
            self.weight_version = str(steps)
        finish = "length" if output.stop_reason not in (None, "completed") else "stop"
        return Generation(
            token_ids=list(output.token_ids),
            logprobs=list(output.log_probs),
            finish_reason=finish,
            weight_version=self.weight_version,
        )

    async def close(self) -> None:
        return None


@register(AGENT_NAME)
class OrchardAgentLoop(AgentLoopBase):
    """One orchard-async episode per ``run`` (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        task_of: Callable[..., Any] | str | None = None,
        messages_of: Callable[..., Any] | str | None = None,
        parse_reply: Callable[[str], Any] | str | None = None,
        adapter: Adapter | str = "local",
        adapter_options: dict[str, Any] | None = None,
        max_retries: int = 1,
        tools: Any = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        if task_of is None or messages_of is None:
            raise ConfigError("the orchard_async agent loop needs task_of and messages_of (module:attribute)")
        self.task_of = resolve(task_of, "task_of")
        self.messages_of = resolve(messages_of, "messages_of")
        self.parse_reply = resolve(parse_reply, "parse_reply") if parse_reply is not None else bash_reply
        self.adapter = adapter
        self.adapter_options = dict(adapter_options or {})
        self.max_retries = max_retries
        self.response_length = self.rollout_config.response_length

    def pool(self) -> Pool:
        if not isinstance(self.adapter, str):
            return _POOLS.setdefault(f"object:{id(self.adapter)}", Pool(self.adapter))
        key = f"{self.adapter}:{sorted(self.adapter_options.items())}"
        if key not in _POOLS:
            from orchard_async.runtime import get_adapter  # the registry: only when a loop runs

            _POOLS[key] = Pool(get_adapter(self.adapter, **self.adapter_options))
        return _POOLS[key]

    def placeholder(self, kwargs: dict[str, Any]) -> list[int]:
        """The row's own prompt ids, for a sample that never sampled (it is masked)."""
        messages = list(kwargs.get("raw_prompt") or [{"role": "user", "content": ""}])
        tokenizer: Any = self.tokenizer  # verl hands over a Hugging Face tokenizer; its stubs vary by version
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return ids or [tokenizer.eos_token_id]

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task = self.task_of(**kwargs)
        engine = VerlServerEngine(self.server_manager, sampling_params, uuid4().hex)
        policy = TokenPolicy(engine, self.tokenizer, self.messages_of, parse_reply=self.parse_reply)
        episode = plan([task], 1)[0]
        trajectory = await run_with_retries(
            episode, policy, self.pool(), run_id=str(kwargs.get("uid", uuid4().hex[:12])), max_retries=self.max_retries
        )
        sample = training_sample(trajectory, self.placeholder(kwargs))
        extra: dict[str, Any] = {
            "turn_scores": [],
            "tool_rewards": [],
            "orchard_trainable": sample.trainable,
            "orchard_end_reason": sample.end_reason,
            "orchard_episode_id": trajectory.episode_id,
        }
        if engine.global_steps:
            extra["min_global_steps"] = min(engine.global_steps)
            extra["max_global_steps"] = max(engine.global_steps)
        mask = sample.response_mask if sample.trainable else [0] * len(sample.response_ids)
        return AgentLoopOutput(
            prompt_ids=sample.prompt_ids,
            response_ids=sample.response_ids[: self.response_length],
            response_mask=mask[: self.response_length],
            response_logprobs=sample.response_logprobs[: self.response_length],
            reward_score=sample.reward if sample.reward is not None else 0.0,
            num_turns=1 + 2 * sample.turns,
            metrics=AgentLoopMetrics(generate_sequences=trajectory.timings.get("agent", 0.0)),
            extra_fields=extra,
        )


@register_adv_est("orchard_grpo")
def compute_orchard_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO's outcome advantage, with every sample whose ``response_mask`` is all 0 (an
    untrainable orchard episode) left out of its group's mean and std; its advantage is 0."""
    scores = token_level_rewards.sum(dim=-1)
    trainable = response_mask.sum(dim=-1) > 0
    groups: dict[Any, list[int]] = defaultdict(list)
    for i in range(scores.shape[0]):
        if trainable[i]:
            groups[index[i]].append(i)
    advantages = torch.zeros_like(scores)
    with torch.no_grad():
        for members in groups.values():
            group = scores[members]
            mean = group.mean() if len(members) > 1 else torch.tensor(0.0)
            std = group.std() if len(members) > 1 else torch.tensor(1.0)
            centred = group - mean
            advantages[members] = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages

"""verl's agent loop contract: the ``orchard_async`` loop is registered by name, built as verl
builds one (``hydra.utils.instantiate`` of its config with the worker's arguments), runs an
orchard-async episode on local sampling through a server manager over the tiny model, and
returns verl's own ``AgentLoopOutput``, which converts as verl converts it (``as_dict``). The
same loop also samples through verl's own client (``LLMServerClient``, its Ray load balancer,
a Ray actor rollout server), as an ``AgentLoopWorker`` hands it over. An
episode whose sandbox could not be made comes back masked, and ``orchard_grpo`` leaves it
out of its group's baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.trainers.conftest import require
from tests.trainers.tasks import FailingCreates

pytestmark = pytest.mark.soak  # a model, a trainer's imports and real episodes: tens of seconds


@pytest.fixture(autouse=True)
def _verl() -> None:
    require("verl", "hydra", "omegaconf", "cachetools", "fastapi", "uvicorn")


class LocalServerManager:
    """verl's ``LLMServerClient.generate`` over a local engine: token ids in, verl's
    ``TokenOutput`` (ids, logprobs, stop reason, the weights' global step) out."""

    def __init__(self, engine: Any, global_step: int):
        self.engine = engine
        self.global_step = global_step
        self.requests: list[tuple[str, list[int], dict[str, Any]]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        from verl.workers.rollout.replica import TokenOutput

        from orchard_async.models.tokens import Sampling

        self.requests.append((request_id, list(prompt_ids), sampling_params))
        sampling = Sampling(max_tokens=sampling_params["max_tokens"], temperature=sampling_params["temperature"])
        generation = await self.engine.generate(prompt_ids, sampling)
        return TokenOutput(
            token_ids=generation.token_ids,
            log_probs=generation.logprobs,
            stop_reason="completed",
            extra_fields={"min_global_steps": self.global_step, "max_global_steps": self.global_step},
        )


def build_loop(tiny_model: Path, tmp_path: Path, server: LocalServerManager, **overrides: Any) -> Any:
    """The loop as verl's AgentLoopWorker makes it (agent_loop.py, _run_agent_loop)."""
    import hydra
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop import agent_loop

    import orchard_async.trainers.verl_loop  # noqa: F401 - registers the loop

    assert agent_loop._agent_loop_registry["orchard_async"] == {
        "_target_": "orchard_async.trainers.verl_loop.OrchardAgentLoop"
    }
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"prompt_length": 1024, "response_length": 512}},
            "data": {"apply_chat_template_kwargs": {}, "mm_processor_kwargs": {}},
        }
    )
    entry = OmegaConf.create(  # an agent_loop_config_path entry
        {
            "name": "orchard_async",
            "_target_": "orchard_async.trainers.verl_loop.OrchardAgentLoop",
            "task_of": "tests.trainers.tasks:task_of_row",
            "messages_of": "tests.trainers.tasks:chat_of",
            "parse_reply": "tests.trainers.tasks:reply_command",
            "adapter": "local",
            "adapter_options": {"root": str(tmp_path / "sandboxes")},
            "max_retries": 0,
        }
    )
    return hydra.utils.instantiate(
        config=entry,
        trainer_config=agent_loop.DictConfigWrap(config=config),
        server_manager=server,
        tokenizer=AutoTokenizer.from_pretrained(tiny_model),
        processor=None,
        hf_model_type="qwen2",
        dataset_cls=None,
        data_config=agent_loop.DictConfigWrap(config.data),
        tools=agent_loop.ToolListWrap([]),
        **overrides,
    )


async def test_the_agent_loop_returns_verls_agent_loop_output(tiny_model: Path, tmp_path: Path) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    from orchard_async.adapters.local import LocalAdapter
    from orchard_async.models.tokens.local import TransformersEngine

    server = LocalServerManager(TransformersEngine(tiny_model), global_step=7)
    loop = build_loop(tiny_model, tmp_path, server)
    row = {"raw_prompt": [{"role": "user", "content": "Say something."}], "extra_info": {"task": "echo"}, "uid": "u1"}
    output = await loop.run({"temperature": 1.0, "max_tokens": 12, "logprobs": True}, **row)
    assert type(output) is AgentLoopOutput
    assert output.extra_fields["orchard_trainable"] is True, output.extra_fields
    assert output.extra_fields["orchard_end_reason"] == "max_steps"
    assert output.extra_fields["min_global_steps"] == output.extra_fields["max_global_steps"] == 7
    assert output.num_turns == 5  # the user's message, then two replies and their observations
    assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs)
    assert set(output.response_mask) == {0, 1}, "sampled tokens 1, the observation's tokens 0"
    # Every token with mask 1 is one the server sampled, in order, with its logprob.
    sampled = [i for i, m in zip(output.response_ids, output.response_mask, strict=True) if m]
    assert len(server.requests) == 2 and len({request_id for request_id, _, _ in server.requests}) == 1
    # The second turn's prompt is the first's plus its reply plus the observation, never re-tokenized.
    first, second = server.requests[0][1], server.requests[1][1]
    assert second[: len(first)] == first == output.prompt_ids
    assert second[len(first) :] == output.response_ids[: len(second) - len(first)]
    assert 0.0 <= output.reward_score <= 1.0 and sampled
    converted = output.as_dict()  # verl's own conversion to the batch's tensors
    assert converted["prompts"].tolist() == output.prompt_ids
    assert converted["responses"].tolist() == output.response_ids
    assert converted["response_mask"].tolist() == output.response_mask
    assert converted["rollout_log_probs"].shape[0] == len(output.response_ids)
    assert converted["rm_scores"][-1].item() == pytest.approx(output.reward_score)

    # An infrastructure failure: masked, flagged, and never a reward in orchard_grpo's baseline.
    adapter = FailingCreates(LocalAdapter(root=tmp_path / "failing"), "echo/g0/s0")
    failing = build_loop(tiny_model, tmp_path, server, adapter=adapter)
    lost = await failing.run({"temperature": 1.0, "max_tokens": 12, "logprobs": True}, **row)
    assert lost.extra_fields["orchard_trainable"] is False
    assert lost.extra_fields["orchard_end_reason"] == "create_failed"
    assert set(lost.response_mask) == {0} and lost.prompt_ids


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    """A local Ray instance for one module: verl's client reaches its servers through Ray."""
    require("ray")
    import ray

    root = str(Path(__file__).resolve().parents[2])
    # The actor's module (tests.trainers) must import in Ray's workers: from this checkout.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": root}})
    try:
        yield ray
    finally:
        ray.shutdown()


async def test_the_loop_samples_through_verls_own_server_client(
    ray_cluster: Any, tiny_model: Path, tmp_path: Path
) -> None:
    """verl's ``LLMServerClient`` (what AgentLoopWorker passes as ``server_manager``), its
    ``GlobalRequestLoadBalancer`` as a Ray actor, and one rollout server actor: the loop's turns
    reach the server through verl's routing (one sticky server per episode), and the
    weights' step the server reports comes back as the turn's version."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    from tests.trainers.verl_engine_server import TinyEngineServer

    ray = ray_cluster
    server = ray.remote(TinyEngineServer).remote(str(tiny_model), 11)
    balancer = ray.remote(GlobalRequestLoadBalancer).remote(servers={"replica-0": server})
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "full_determinism": False}}})
    client = LLMServerClient(config, load_balancer_handle=balancer)
    loop = build_loop(tiny_model, tmp_path, client)  # type: ignore[arg-type]
    row = {"raw_prompt": [{"role": "user", "content": "Say something."}], "extra_info": {"task": "echo"}, "uid": "u2"}
    output = await loop.run({"temperature": 1.0, "max_tokens": 12, "logprobs": True}, **row)
    assert type(output) is AgentLoopOutput
    assert output.extra_fields["orchard_trainable"] is True, output.extra_fields
    assert output.extra_fields["min_global_steps"] == output.extra_fields["max_global_steps"] == 11
    seen = await server.seen.remote()
    assert len(seen) == 2, "two turns, both routed by verl's balancer to its one server"
    first, second = seen[0][1], seen[1][1]
    assert first == output.prompt_ids and second[: len(first)] == first
    assert second[len(first) :] == output.response_ids[: len(second) - len(first)]
    sampled = [i for i, m in zip(output.response_ids, output.response_mask, strict=True) if m]
    assert sampled and len(output.response_logprobs) == len(output.response_ids)
    converted = output.as_dict()
    assert converted["responses"].tolist() == output.response_ids


def test_orchard_grpo_leaves_untrainable_samples_out_of_the_baseline() -> None:
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    import orchard_async.trainers.verl_loop  # noqa: F401 - registers the estimator

    estimator = get_adv_estimator_fn("orchard_grpo")
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.0, 0.5])
    mask = torch.ones(4, 3)
    mask[2] = 0  # sample 2 was not judged: masked, reward 0.0 only as a placeholder
    advantages, _ = estimator(rewards, mask, np.array(["g", "g", "g", "h"]))
    judged = torch.tensor([1.0, 0.0])
    expected = (judged - judged.mean()) / (judged.std() + 1e-6)
    assert advantages[0, 0].item() == pytest.approx(expected[0].item())
    assert advantages[1, 0].item() == pytest.approx(expected[1].item())
    assert advantages[2].abs().sum().item() == 0
    assert advantages[3, 0].item() == pytest.approx(0.5)  # a group of one: no baseline, as verl's GRPO

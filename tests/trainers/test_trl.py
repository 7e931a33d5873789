"""TRL's GRPOTrainer (the real package) trains on orchard-async episodes through
``OrchardRolloutFunc``: two steps on the CPU with a tiny random model, rollouts on the local
adapter; the loss is finite, the parameters change, and an episode whose sandbox could not be
made is masked (env_mask all 0, reward None: unscorable to TRL), never scored."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.trainers.conftest import require
from tests.trainers.tasks import EchoTask, FailingCreates, chat_of, reply_command, task_of_row

pytestmark = pytest.mark.soak  # a model, a trainer's imports and real episodes: tens of seconds


@pytest.fixture(autouse=True)
def _trl() -> None:
    require("trl", "datasets", "accelerate")


def test_grpo_trains_two_steps_on_orchard_episodes(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from orchard_async.adapters.local import LocalAdapter
    from orchard_async.models.tokens import Sampling
    from orchard_async.trainers import EpisodeRunner
    from orchard_async.trainers.trl_rollout import OrchardRolloutFunc, orchard_reward

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    tasks = {"first": EchoTask("first"), "second": EchoTask("second")}
    # The first batch's group 0, sample 1: its sandbox cannot be made (an infrastructure failure).
    adapter = FailingCreates(LocalAdapter(root=tmp_path / "sandboxes"), "first/g0/s1")
    runner = EpisodeRunner(adapter, concurrency=8, max_retries=0)
    rollout_func = OrchardRolloutFunc(
        runner,
        lambda prompt: tasks[prompt],
        messages_of=chat_of,
        parse_reply=reply_command,
        sampling=Sampling(max_tokens=12, temperature=1.0),
    )
    batches = []
    original = rollout_func.__call__

    def recording(prompts, trainer):  # what TRL got for each batch
        output = original(prompts, trainer)
        batches.append((list(prompts), output, list(rollout_func.last)))
        return output

    config = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=2,
        learning_rate=5e-2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        beta=0.0,
        max_completion_length=64,
        save_strategy="no",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=orchard_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["first", "second"] * 4}),
        processing_class=tokenizer,
        rollout_func=recording,
    )
    try:
        result = trainer.train()
    finally:
        rollout_func.close()
    assert trainer.state.global_step == 2 and len(batches) >= 2
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(math.isfinite(loss) for loss in losses), trainer.state.log_history
    assert math.isfinite(result.training_loss)
    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert changed, "two GRPO steps on orchard episodes must move the weights"

    # Every sample is an episode of its prompt's task; each batch's repeats are one group.
    failed = []
    for prompts, output, samples in batches:
        assert len(output["completion_ids"]) == len(prompts) == len(samples)
        for prompt, sample in zip(prompts, samples, strict=True):
            assert sample.episode_id.startswith(f"{prompt}/")
        for sample, mask, reward in zip(samples, output["env_mask"], output["orchard_reward"], strict=True):
            if sample.trainable:
                assert reward is not None and 1 in mask and len(mask) == len(sample.response_ids)
                assert sample.weight_versions and set(sample.weight_versions) <= {"0", "1"}
            else:
                failed.append(sample)
                assert reward is None and set(mask) == {0}, "an infrastructure failure is masked, never scored"
    assert [s.end_reason for s in failed] == ["create_failed"], [s.end_reason for s in failed]
    assert [s.episode_id for s in failed] == ["first/g0/s1"]
    # TRL took it as unscorable: the reward it logged is the mean over the judged samples only.
    first_prompts, first_output, _ = batches[0]
    assert orchard_reward(["x"] * len(first_prompts), first_output["orchard_reward"])[1] is None


def test_grpo_runs_with_the_orchard_environment_factory(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    """TRL builds its pool of ``OrchardEnvironment``s, resets one per sample with the dataset
    row (an episode starts on local each time) and asks each for its reward. The random model
    calls no tool, so every episode is submitted untouched and its verifier cannot read the
    file it grades: ``verifier_error``, unscorable to TRL (None), never a reward."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from orchard_async.adapters.local import LocalAdapter
    from orchard_async.trainers import EpisodeRunner
    from orchard_async.trainers.trl_rollout import OrchardEnvironment

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    tokenizer.chat_template = qwen2_5_chat_template  # TRL's own tool-calling template (the test model's has no tools)
    made: list[OrchardEnvironment] = []
    with EpisodeRunner(LocalAdapter(root=tmp_path / "sandboxes")) as runner:
        environment = OrchardEnvironment.factory(runner, lambda row: task_of_row(**row))

        def factory() -> OrchardEnvironment:
            made.append(environment())
            return made[-1]

        config = GRPOConfig(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=4,
            num_generations=4,
            max_steps=2,
            report_to=[],
            use_cpu=True,
            bf16=False,
            beta=0.0,
            max_completion_length=16,
            save_strategy="no",
            logging_steps=1,
            seed=0,
        )
        rows = {"prompt": [[{"role": "user", "content": "Go."}]] * 8, "extra_info": [{"task": "echo"}] * 8}
        trainer = GRPOTrainer(
            model=model,
            args=config,
            train_dataset=Dataset.from_dict(rows),
            processing_class=tokenizer,
            environment_factory=factory,
        )
        trainer.train()
    assert trainer.state.global_step == 2
    played = [env for env in made if env.count]
    assert len(played) == 4 and all(env.count == 2 for env in played), [env.count for env in made]
    assert {env.ended.end_reason for env in played if env.ended} == {"verifier_error"}
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    assert rewards and all(reward is None or math.isnan(reward) for reward in rewards), rewards

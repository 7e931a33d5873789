"""Token-in/token-out episodes of the toy, SWE, claw and GUI recipes through the transformers
engine (a tiny random Qwen2 model, tests/models/tiny_model.py), on the local adapter (the GUI's
in a real headless Chromium, its pages as text):

* the prefix invariant on every turn of every episode: the prompt of turn t+1 is the prompt
  of turn t, its sampled tokens and the observation's tokens, never a re-tokenization;
* logprob parity: one forward pass of the same model over each exported record's ids gives
  every mask-1 token's exported logprob within 1e-4;
* the export loads with Hugging Face ``datasets`` and reads back equal.

The first turn of each episode is sampled freely (an unreadable reply cut at the token
limit: the format-error path and a turn the sampler did not close); later turns play the
task's known solution, their tokens scored by the model as sampling scores them, so the
episodes resolve and their observations are real command output. Also: the engine itself
records the model's own logprobs. In the soak run (transformers' import is slow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchard_async.adapters.local import LocalAdapter
from orchard_async.engine.rollout import collect
from orchard_async.errors import ConfigError
from orchard_async.models.tokens import Sampling, make_engine
from orchard_async.models.tokens.local import TransformersEngine, load_tokenizer
from orchard_async.models.tokens.policy import token_policy
from orchard_async.records.export import export_tokens
from orchard_async.records.trajectory import read_trajectories
from tests.models.token_support import ScriptedEngine, check_prefix_invariant, gui_solution_reply, recompute_logprobs

# Importing transformers' model code alone takes 5-10 s per worker: the default run leaves them out.
pytestmark = pytest.mark.soak


def bash(command: str, thought: str = "") -> str:
    return f"{thought}```bash\n{command}\n```"


async def run_tokens(recipe: str, tasks: list[Any], script: Any, tiny_model: Path, tmp_path: Path) -> Any:
    tokenizer = load_tokenizer(tiny_model)
    engine = ScriptedEngine(TransformersEngine(tiny_model, seed=1), tokenizer, script)
    policy = token_policy(recipe, engine, tokenizer=tokenizer, environ={})
    policy.sampling = Sampling(max_tokens=12)
    out = tmp_path / "run.jsonl"
    async with LocalAdapter(root=tmp_path / "sbx") as adapter:
        await collect(tasks, policy, adapter, out, concurrency=4, run_header={"recipe": recipe})
    return engine, list(read_trajectories(out)), out


def check_export(
    engine: ScriptedEngine, trajectories: list[Any], out: Path, tmp_path: Path, *, recipe_turns: int = 0
) -> list[dict[str, Any]]:
    """``recipe_turns``: the steps per episode the recipe takes itself, asking no model (the GUI's
    submit after an answer)."""
    import json

    import datasets

    for trajectory in trajectories:
        assert trajectory.status == "finished", trajectory.error
        turns = check_prefix_invariant(trajectory, engine)
        assert turns == len(trajectory.steps) - recipe_turns >= 3
        sampled = [step for step in trajectory.steps if step.action.tokens is not None]
        assert {step.action.tokens.segment for step in sampled} == {0}  # the delta held on every turn
    exported = tmp_path / "tokens.jsonl"
    summary = export_tokens(out, exported)
    assert summary.records == summary.episodes == len(trajectories) and summary.skipped == 0
    records = [json.loads(line) for line in exported.read_text().splitlines()]
    loaded = datasets.load_dataset("json", data_files=str(exported), split="train")
    assert [dict(row) for row in loaded] == records
    worst = 0.0
    for record in records:
        assert len(record["response_ids"]) == len(record["response_mask"]) == len(record["response_logprobs"])
        pairs = recompute_logprobs(engine.inner.model, record)
        assert len(pairs) == sum(record["response_mask"]) > 0
        worst = max([worst, *(abs(exported - again) for exported, again in pairs)])
        assert record["weight_versions"] == ["0"] * (record["turns"] - recipe_turns)  # turns: the episode's steps
    assert worst < 1e-4, worst
    return records


async def test_toy_episodes_keep_their_tokens_and_logprobs(tiny_model: Path, tmp_path: Path) -> None:
    from orchard_async.recipes import toy

    tasks = toy.builtin_tasks(1)

    def script(prompt: str, turn: int) -> str | None:
        if turn == 0:
            return None
        (task,) = [task for task in tasks if task.instruction in prompt]
        steps = task.solution
        return bash(steps[turn - 1]) if turn <= len(steps) else bash("submit")

    engine, trajectories, out = await run_tokens("toy", tasks, script, tiny_model, tmp_path)
    assert len(trajectories) == 5
    assert all(t.success and t.end_reason == "submitted" for t in trajectories)
    records = check_export(engine, trajectories, out, tmp_path)
    tokenizer = engine.tokenizer
    for trajectory in trajectories:
        first, second = trajectory.steps[0], trajectory.steps[1]
        assert first.action.kind == "invalid" and first.action.tokens.finish_reason == "length"
        # the toy chat leaves an unreadable reply out; the model is still told what went wrong
        added = tokenizer.decode(second.action.tokens.prompt_ids, skip_special_tokens=False)
        assert added.startswith("<|im_end|>\n<|im_start|>user\nerror: expected exactly one ```bash block")
        ran = trajectory.steps[1]
        answer = tokenizer.decode(trajectory.steps[2].action.tokens.prompt_ids, skip_special_tokens=False)
        assert answer.startswith("\n<|im_start|>user\n")  # the sampler closed its own turn: only the newline
        assert (ran.observation or f"(no output; exit status {ran.exit_code})")[:50] in answer
    assert {r["end_reason"] for r in records} == {"submitted"} and all(r["reward"] == 1.0 for r in records)


async def test_swe_episodes_keep_their_tokens_and_logprobs(tiny_model: Path, tmp_path: Path) -> None:
    from orchard_async.recipes.swe import load_tasks
    from orchard_async.recipes.swe.policies import gold_patch_command

    tasks = load_tasks("builtin:minicalc__1,textkit__2")

    def script(prompt: str, turn: int) -> str | None:
        if turn == 0:
            return None
        (task,) = [task for task in tasks if task.instance.problem_statement.strip()[:200] in prompt]
        steps = [gold_patch_command(task.instance.patch), "git diff --stat", "submit"]
        return bash(steps[min(turn - 1, 2)], "THOUGHT: next.\n\n")

    engine, trajectories, out = await run_tokens("swe", tasks, script, tiny_model, tmp_path)
    assert [t.end_reason for t in trajectories] == ["submitted"] * 2
    assert all(t.success for t in trajectories), [t.info for t in trajectories]
    records = check_export(engine, trajectories, out, tmp_path)
    for record in records:
        text = engine.tokenizer.decode(record["response_ids"], skip_special_tokens=False)
        assert "<returncode>0</returncode>" in text  # the SWE recipe's own observation format


async def test_the_transformers_engine_records_the_models_own_logprobs(tiny_model) -> None:  # type: ignore[no-untyped-def]
    import torch

    engine = make_engine(f"transformers:{tiny_model}")
    prompt = [1, 40, 41, 42, 43]
    first = await engine.generate(prompt, Sampling(max_tokens=12, seed=3))
    again = await engine.generate(prompt, Sampling(max_tokens=12, seed=3))
    greedy = await engine.generate(prompt, Sampling(max_tokens=12, temperature=0))
    assert first == again  # a seed fixes the sample
    assert len(first.token_ids) == len(first.logprobs) and first.finish_reason in ("stop", "length")
    assert first.weight_version == "0"
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + first.token_ids])).logits[0].float()  # type: ignore[attr-defined]
    recomputed = torch.log_softmax(logits, dim=-1)
    for i, token in enumerate(first.token_ids):
        assert abs(float(recomputed[len(prompt) - 1 + i, token]) - first.logprobs[i]) < 1e-4
    with torch.no_grad():
        step = engine.model(torch.tensor([prompt])).logits[0, -1]  # type: ignore[attr-defined]
    assert greedy.token_ids[0] == int(step.argmax())
    with pytest.raises(ConfigError, match="top_p"):
        await engine.generate(prompt, Sampling(top_p=0.5))


async def test_claw_episodes_keep_their_tokens_and_logprobs(tiny_model: Path, tmp_path: Path) -> None:
    """The claw recipe in the shell agent's chat: an unreadable first reply does not switch
    the chat, so the episode stays one sequence whose logprobs the model gives again."""
    from orchard_async.recipes import claw

    tasks = claw.load_tasks("builtin:mail-reply-dana")

    def script(prompt: str, turn: int) -> str | None:
        if turn == 0:
            return None
        steps = [*tasks[0].oracle, "submit"]
        return bash(steps[min(turn - 1, len(steps) - 1)], "THOUGHT: next.\n\n")

    engine, trajectories, out = await run_tokens("claw", tasks, script, tiny_model, tmp_path)
    assert [(t.end_reason, t.success) for t in trajectories] == [("submitted", True)], [t.info for t in trajectories]
    records = check_export(engine, trajectories, out, tmp_path)
    assert records[0]["segments"] == 1 and records[0]["reward"] == 1.0


async def test_gui_episodes_keep_their_tokens_and_logprobs(tiny_model: Path, tmp_path: Path) -> None:
    """GUI episodes (two sites) in a real headless Chromium, the model seeing each page as text:
    an unreadable first reply, then the task's solution with every element found in the page
    text the model was last shown; the recipe's own submit after the answer asks no model."""

    from orchard_async.recipes import gui
    from tests.conftest import backend_missing
    from tests.recipes.test_gui_browser import _chromium

    if _chromium() is None:
        backend_missing("the gui recipe needs Chromium (Debian: apt-get install chromium)")
    tasks = gui.load_tasks("builtin:forum-codename,booking-reference")

    def script(prompt: str, turn: int) -> str | None:
        if turn == 0:
            return None
        (task,) = [task for task in tasks if task.line.intent in prompt]
        return gui_solution_reply(task, prompt, turn)

    engine, trajectories, out = await run_tokens("gui", tasks, script, tiny_model, tmp_path)
    assert [(t.end_reason, t.reward) for t in trajectories] == [("submitted", 1.0)] * 2, [t.info for t in trajectories]
    records = check_export(engine, trajectories, out, tmp_path, recipe_turns=1)
    for trajectory in trajectories:
        (task,) = [task for task in tasks if task.id == trajectory.task_id]
        kinds = [step.action.kind for step in trajectory.steps]
        assert kinds == ["invalid", *["exec"] * len(task.solution), "submit"]
        assert trajectory.steps[0].action.tokens.finish_reason == "length"
        assert trajectory.steps[-1].action.tokens is None
    for record in records:
        text = engine.tokenizer.decode(record["prompt_ids"] + record["response_ids"], skip_special_tokens=False)
        assert "sha256=" not in text and "\n---\n" in text  # the pages as text, no screenshot
        assert record["segments"] == 1

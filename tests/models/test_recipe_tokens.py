"""Token-in/token-out episodes of the claw and GUI recipes on the default run's budget (the
character tokenizer and the scripted token engine of tests/models/token_support.py): the
prefix invariant on every turn, one segment per episode (an unreadable reply does not
switch the recipe's chat), and the token export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchard_async.adapters.local import LocalAdapter
from orchard_async.engine.rollout import collect
from orchard_async.models.tokens.policy import token_policy
from orchard_async.records.export import export_tokens
from orchard_async.records.trajectory import Trajectory, read_trajectories
from tests.models.token_support import CharTokenizer, FakeTokenEngine, check_prefix_invariant


async def run(recipe: str, policy: Any, tasks: list[Any], tmp_path: Path) -> tuple[list[Trajectory], Path]:
    out = tmp_path / "run.jsonl"
    async with LocalAdapter(root=tmp_path / "sbx") as adapter:
        await collect(tasks, policy, adapter, out, concurrency=4, run_header={"recipe": recipe})
    return list(read_trajectories(out)), out


def check_one_segment(trajectories: list[Trajectory], engine: FakeTokenEngine, out: Path, tmp_path: Path) -> None:
    for trajectory in trajectories:
        assert check_prefix_invariant(trajectory, engine) == len(trajectory.steps) >= 3
        assert {step.action.tokens.segment for step in trajectory.steps} == {0}, trajectory.episode_id
    summary = export_tokens(out, tmp_path / "tokens.jsonl")
    assert summary.records == len(trajectories) and summary.skipped == 0
    for record in map(json.loads, (tmp_path / "tokens.jsonl").read_text().splitlines()):
        assert record["segments"] == 1 and record["reward"] == 1.0
        assert len(record["response_ids"]) == len(record["response_mask"]) == len(record["response_logprobs"])


async def test_claw_episodes_stay_one_segment_after_an_unreadable_reply(tmp_path: Path) -> None:
    from orchard_async.recipes import claw

    tasks = claw.load_tasks("builtin:mail-reply-dana")

    def script(prompt: str, turn: int) -> str | None:
        if turn == 0:
            return None  # noise cut at the token limit: an unreadable reply first
        (task,) = [task for task in tasks if task.prompt[:80] in prompt]
        steps = [*task.oracle, "submit"]
        return f"THOUGHT: next.\n\n```bash\n{steps[min(turn - 1, len(steps) - 1)]}\n```"

    tokenizer = CharTokenizer()
    engine = FakeTokenEngine(tokenizer, script)
    policy = token_policy("claw", engine, tokenizer=tokenizer, environ={})
    trajectories, out = await run("claw", policy, tasks, tmp_path)
    assert [(t.status, t.success) for t in trajectories] == [("finished", True)], [t.error for t in trajectories]
    check_one_segment(trajectories, engine, out, tmp_path)
    for trajectory in trajectories:
        assert trajectory.steps[0].action.kind == "invalid"
        told = tokenizer.decode(trajectory.steps[1].action.tokens.prompt_ids)
        assert told.startswith("<|im_end|>\n<|im_start|>user\nerror: expected exactly one ```bash block")
        # the export's chat is the shell agent's, with the model's own replies, the unreadable one too
        messages = claw.training_chats({}).messages_of(trajectory)
        assert messages[0]["content"] == claw.export.shell_system_prompt()
        assert messages[2] == claw.export.message("assistant", trajectory.steps[0].action.raw)
        assert messages[4]["content"] == trajectory.steps[1].action.raw

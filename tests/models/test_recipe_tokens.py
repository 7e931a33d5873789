"""Token-in/token-out episodes of the claw and GUI recipes on the default run's budget (the
character tokenizer and the scripted token engine of tests/models/token_support.py): the
prefix invariant on every turn, one segment per episode (an unreadable reply does not
switch the recipe's chat), and the token export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchard_async.adapters.local import LocalAdapter
from orchard_async.engine.rollout import collect
from orchard_async.models.tokens.policy import token_policy
from orchard_async.records.export import export_tokens, token_records
from orchard_async.records.trajectory import Trajectory, read_trajectories
from tests.models.token_support import CharTokenizer, FakeTokenEngine, check_prefix_invariant, gui_solution_reply


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


def gui_page(feedback: str, tree: str) -> str:
    digest = f"{len(feedback):064x}"
    return f"feedback: {feedback}\nurl: http://127.0.0.1:7101/\nscreenshot: sha256={digest} 1280x720 24 bytes\n---\n{tree}\n"


async def test_gui_token_turns_see_the_page_as_text_and_extend_every_turn() -> None:
    """The GUI recipe's token seam, stepped by hand (no browser): the model's chat is text
    only, every turn extends the last (an unreadable reply too), and the recipe's own submit
    after an answer asks no model."""
    from orchard_async.recipes.gui.task import PAGE_MARKER
    from orchard_async.records.trajectory import Step
    from orchard_async.task import Observation

    replies = [
        "Let me look around.",  # no action: a format error
        'The bags.\n```json\n{"action": "click", "element": "29"}\n```',
        'click(element="40")',
        '```json\n{"action": "answer", "text": "Added."}\n```',
    ]
    tokenizer = CharTokenizer()
    engine = FakeTokenEngine(tokenizer, lambda prompt, turn: replies[turn])
    policy = token_policy("gui", engine, tokenizer=tokenizer, environ={})
    instruction = f"Add one tote to the cart.\n\n{PAGE_MARKER}\n" + gui_page("opened", '[4] RootWebArea "Shop"')
    pages = [gui_page("clicked [29]", '[40] button "Tote"'), gui_page("clicked [40]", "[41] text"), ""]
    pages[2] = 'answer recorded: "Added."\nurl: http://127.0.0.1:7101/\n'

    class Task:
        id = "shop-add-tote"

    steps: list[Step] = []
    for index in range(5):
        action = await policy.act(Observation("ep", Task(), instruction, index, list(steps), 60.0))
        if action.kind == "submit":
            steps.append(Step(index=index, action=action))
            break
        observation = f"error: {action.error}" if action.kind == "invalid" else pages[index - 1]
        steps.append(Step(index=index, action=action, observation=observation))
    assert [step.action.kind for step in steps] == ["invalid", "exec", "exec", "exec", "submit"]
    assert len(engine.calls) == 4 and steps[-1].action.tokens is None  # the submit: no model turn
    trajectory = Trajectory(
        episode_id="ep", task_id="shop-add-tote", group_id="g", sample=0, policy="tokens", adapter="local",
        run_id="r", status="finished", end_reason="submitted", instruction=instruction, steps=steps, reward=1.0,
    )  # fmt: skip
    assert check_prefix_invariant(trajectory, engine) == 4
    assert {step.action.tokens.segment for step in steps[:-1]} == {0}
    seen = tokenizer.decode(engine.calls[-1][0])
    assert "sha256=" not in seen and "screenshot" not in seen.split("<|im_end|>", 1)[1]  # text only
    assert '[40] button "Tote"' in seen and "Format error: no action found" in seen
    assert "its accessibility tree. Reply" in seen  # the prompt promises no screenshot
    (record,) = token_records([trajectory])
    assert record["segments"] == 1 and sum(record["response_mask"]) == sum(
        len(s.action.tokens.token_ids) for s in steps[:-1]
    )


def test_gui_token_chats_refuse_coordinates() -> None:
    from orchard_async.errors import ConfigError
    from orchard_async.recipes import gui

    with pytest.raises(ConfigError, match="addressing=element"):
        gui.token_chats({"addressing": "coordinates"})


@pytest.mark.soak  # Chromium's start and a whole episode: seconds
async def test_gui_token_episode_in_chromium(tmp_path: Path) -> None:
    """A whole GUI episode through the token policy in a real headless Chromium: an
    unreadable reply first, then the task's solution with each element found in the page
    text the model was shown; solved, one segment, every turn extending the last."""
    from orchard_async.recipes import gui
    from tests.conftest import backend_missing
    from tests.recipes.test_gui_browser import _chromium

    if _chromium() is None:
        backend_missing("the gui recipe needs Chromium (Debian: apt-get install chromium)")
    (task,) = gui.load_tasks("builtin:shop-add-tote")

    def script(prompt: str, turn: int) -> str | None:
        if turn == 0:
            return None
        return gui_solution_reply(task, prompt, turn)

    tokenizer = CharTokenizer()
    engine = FakeTokenEngine(tokenizer, script)
    policy = token_policy("gui", engine, tokenizer=tokenizer, environ={})
    trajectories, out = await run("gui", policy, [task], tmp_path)
    (trajectory,) = trajectories
    assert (trajectory.status, trajectory.reward) == ("finished", 1.0), (trajectory.error, trajectory.info)
    assert trajectory.steps[0].action.kind == "invalid" and trajectory.steps[-1].action.kind == "submit"
    sampled = [step for step in trajectory.steps if step.action.tokens is not None]
    assert len(sampled) == len(trajectory.steps) - 1 == len(task.solution) + 1
    assert check_prefix_invariant(trajectory, engine) == len(sampled)
    assert {step.action.tokens.segment for step in sampled} == {0}
    assert all("sha256=" not in tokenizer.decode(ids) for ids, _ in engine.calls)
    summary = export_tokens(out, tmp_path / "tokens.jsonl")
    assert summary.records == 1 and summary.skipped == 0

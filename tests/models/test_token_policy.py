"""The token policy on the default run's budget (no transformers): a character tokenizer
with a ChatML template and scripted token engines (tests/models/token_support.py), on the
local adapter. The prefix invariant on every turn, a history rewrite recorded as a new
segment, the token export (infrastructure outcomes left out and counted), the SGLang
engine end to end, and the command line's --policy tokens / export tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchard_async.adapters.local import LocalAdapter
from orchard_async.apps.cli import main
from orchard_async.engine.rollout import collect
from orchard_async.models.tokens import Sampling
from orchard_async.models.tokens.engines import SGLangEngine
from orchard_async.models.tokens.policy import TokenPolicy, bash_reply, token_policy
from orchard_async.records.export import export_tokens, token_records
from orchard_async.records.trajectory import EndReason, Trajectory, read_trajectories
from orchard_async.task import Observation
from tests.models.fake_engines import FakeServer, serve
from tests.models.token_support import CharTokenizer, FakeTokenEngine, check_prefix_invariant


def toy_script(tasks: list[Any]) -> Any:
    def script(prompt: str, turn: int) -> str | None:
        if turn == 0:
            return None  # noise cut at the token limit: a format error the sampler did not close
        (task,) = [task for task in tasks if task.instruction in prompt]
        steps = [*task.solution, "submit"]
        return f"```bash\n{steps[min(turn - 1, len(steps) - 1)]}\n```"

    return script


async def run(policy: Any, tasks: list[Any], tmp_path: Path) -> tuple[list[Trajectory], Path]:
    out = tmp_path / "run.jsonl"
    async with LocalAdapter(root=tmp_path / "sbx") as adapter:
        await collect(tasks, policy, adapter, out, concurrency=5, run_header={"recipe": "toy"})
    return list(read_trajectories(out)), out


async def test_toy_episodes_extend_their_prompt_every_turn(tmp_path: Path) -> None:
    from orchard_async.recipes import toy

    tasks = toy.builtin_tasks(1)
    tokenizer = CharTokenizer()
    engine = FakeTokenEngine(tokenizer, toy_script(tasks))
    policy = token_policy("toy", engine, tokenizer=tokenizer, environ={})
    trajectories, out = await run(policy, tasks, tmp_path)
    assert len(trajectories) == 5 and all(t.success for t in trajectories), [t.error for t in trajectories]
    for trajectory in trajectories:
        assert check_prefix_invariant(trajectory, engine) == len(trajectory.steps)
        turns = [step.action.tokens for step in trajectory.steps]
        assert {turn.segment for turn in turns} == {0} and {turn.weight_version for turn in turns} == {"v1"}
        # the noise turn was cut (length): the template's whole end of turn goes in front of the error
        error = tokenizer.decode(turns[1].prompt_ids)
        assert error.startswith("<|im_end|>\n<|im_start|>user\nerror: expected exactly one ```bash block")
        assert error.endswith("<|im_end|>\n<|im_start|>assistant\n")
        # a turn the sampler closed itself: only the newline the template puts after <|im_end|>
        ran = trajectory.steps[1]
        answer = tokenizer.decode(turns[2].prompt_ids)
        shown = ran.observation or f"(no output; exit status {ran.exit_code})"
        assert answer == f"\n<|im_start|>user\n{shown}<|im_end|>\n<|im_start|>assistant\n"
    summary = export_tokens(out, tmp_path / "tokens.jsonl")
    assert summary.records == 5 and summary.skipped == 0
    record = json.loads((tmp_path / "tokens.jsonl").read_text().splitlines()[0])
    trajectory = next(t for t in trajectories if t.episode_id == record["episode_id"])
    turns = [step.action.tokens for step in trajectory.steps]
    assert record["prompt_ids"] == turns[0].prompt_ids
    expected_ids: list[int] = []
    expected_mask: list[int] = []
    expected_logprobs: list[float] = []
    for i, turn in enumerate(turns):
        if i:
            expected_ids += turn.prompt_ids
            expected_mask += [0] * len(turn.prompt_ids)
            expected_logprobs += [0.0] * len(turn.prompt_ids)
        expected_ids += turn.token_ids
        expected_mask += [1] * len(turn.token_ids)
        expected_logprobs += turn.logprobs
    assert record["response_ids"] == expected_ids and record["response_mask"] == expected_mask
    assert record["response_logprobs"] == expected_logprobs
    assert record["reward"] == 1.0 and record["end_reason"] == "submitted" and record["segments"] == 1
    assert record["group_id"].endswith(trajectory.group_id) and record["weight_versions"] == ["v1"] * len(turns)


async def test_an_episode_leaves_nothing_in_the_policy_however_it_ends(tmp_path: Path) -> None:
    """What the policy keeps to save a turn's work (the conversation, the prompt's ids) goes
    when the episode ends, whether or not it submitted: here each one runs out of steps."""
    from orchard_async.recipes import toy

    tokenizer = CharTokenizer()
    engine = FakeTokenEngine(tokenizer, lambda prompt, turn: "```bash\ntrue\n```")
    policy = token_policy("toy", engine, tokenizer=tokenizer, environ={})
    trajectories, _ = await run(policy, toy.builtin_tasks(1), tmp_path)
    assert len(trajectories) == 5 and {t.end_reason for t in trajectories} == {"max_steps"}
    assert not policy._conversations and not policy._prompts and policy._prompt_ids == 0


def observation(steps: list[Any], step: int) -> Observation:
    class Task:
        id = "t"

    return Observation("ep", Task(), "do it", step, steps, 60.0)


async def test_a_rewritten_history_starts_a_new_segment() -> None:
    """A recipe whose chat rewrites an earlier message (here: it shortens old observations
    once there are three steps) cannot be continued token for token: that turn's prompt is
    the whole conversation rendered afresh, in a new segment."""
    from orchard_async.records.trajectory import Step

    def messages_of(trajectory: Trajectory) -> list[dict[str, Any]]:
        messages = [{"role": "user", "content": trajectory.instruction}]
        for step in trajectory.steps:
            messages.append({"role": "assistant", "content": step.action.raw})
            old = len(trajectory.steps) >= 3 and step.index == 0
            messages.append({"role": "user", "content": "(elided)" if old else step.observation})
        return messages

    tokenizer = CharTokenizer()
    engine = FakeTokenEngine(tokenizer, lambda prompt, turn: f"```bash\necho {turn}\n```")
    policy = TokenPolicy(engine, tokenizer, messages_of, parse_reply=bash_reply)
    steps: list[Step] = []
    for index in range(4):
        action = await policy.act(observation(steps, index))
        steps.append(Step(index=index, action=action, observation=f"out {index}"))
    segments = [step.action.tokens.segment for step in steps]
    assert segments == [0, 0, 0, 1]
    rendered = tokenizer.apply_chat_template(
        messages_of(Trajectory(**{**BASE, "steps": steps[:3]})), tokenize=False, add_generation_prompt=True
    )
    assert "(elided)" in rendered and steps[3].action.tokens.prompt_ids == tokenizer(rendered)["input_ids"]
    trajectory = Trajectory(**{**BASE, "steps": steps})
    records = token_records([trajectory])
    assert [(r["segment"], r["turns"], r["last_segment"]) for r in records] == [(0, 4, False), (1, 4, True)]
    assert len(records[1]["weight_versions"]) == 1 and records[1]["response_mask"] == [1] * len(
        steps[3].action.tokens.token_ids
    )


BASE: dict[str, Any] = {
    "episode_id": "ep",
    "task_id": "t",
    "group_id": "t/g0",
    "sample": 0,
    "policy": "tokens",
    "adapter": "local",
    "run_id": "r",
    "status": "finished",
    "end_reason": EndReason.SUBMITTED,
    "instruction": "do it",
}


def test_infrastructure_outcomes_are_left_out_and_counted() -> None:
    from collections import Counter

    from orchard_async.records.trajectory import Action, Step, TurnTokens

    turn = TurnTokens(prompt_ids=[1, 2], token_ids=[3], logprobs=[-0.5], finish_reason="stop", weight_version="1")
    sampled = [Step(index=0, action=Action(kind="submit", tokens=turn))]
    trajectories = [
        Trajectory(**{**BASE, "episode_id": "a", "steps": sampled, "reward": 1.0}),
        Trajectory(**{**BASE, "episode_id": "b", "steps": sampled, "status": "failed", "end_reason": "sandbox_lost"}),
        Trajectory(
            **{**BASE, "episode_id": "c", "steps": sampled, "status": "failed", "end_reason": "model_unavailable"}
        ),
        Trajectory(**{**BASE, "episode_id": "d", "steps": [Step(index=0, action=Action(kind="submit"))]}),
    ]
    skipped: Counter[str] = Counter()
    records = token_records(trajectories, skipped)
    assert [r["episode_id"] for r in records] == ["a"]
    assert records[0]["prompt_ids"] == [1, 2] and records[0]["response_logprobs"] == [-0.5]
    assert skipped == {"sandbox_lost": 1, "model_unavailable": 1, "no_tokens": 1}


async def test_the_sglang_engine_end_to_end(tmp_path: Path) -> None:
    from orchard_async.recipes import toy

    tasks = toy.builtin_tasks(1)[:2]
    server = FakeServer(weight_version="w7")
    async with serve(server) as url:
        engine = SGLangEngine.from_env(url, {})
        policy = token_policy("toy", engine, tokenizer=CharTokenizer(), environ={"ORCHARD_MAX_TOKENS": "9"})
        assert policy.sampling == Sampling(max_tokens=9)
        trajectories, _ = await run(policy, tasks, tmp_path)
        await policy.close()
    assert [t.end_reason for t in trajectories] == ["max_steps"] * 2  # noise never parses: 10 format errors
    for trajectory in trajectories:
        assert check_prefix_invariant(trajectory, _Calls(server)) == 10
        assert {step.action.tokens.weight_version for step in trajectory.steps} == {"w7"}


class _Calls:
    """The fake server's requests and answers, as check_prefix_invariant reads an engine's calls."""

    def __init__(self, server: FakeServer):
        from tests.models.fake_engines import sample

        self.calls = []
        for body in server.received:
            ids = body["input_ids"]
            tokens, logprobs, finish = sample(ids, body["sampling_params"]["max_new_tokens"], [])
            from orchard_async.models.tokens import Generation

            self.calls.append((ids, Generation(token_ids=tokens, logprobs=logprobs, finish_reason=finish)))


def test_the_command_line_checks_the_token_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "run.jsonl")
    assert main(["run", "toy", "--policy", "tokens", "--out", out]) == 2
    assert "--policy tokens needs --engine" in capsys.readouterr().err
    assert main(["run", "toy", "--engine", "sglang:http://127.0.0.1:9", "--out", out]) == 2
    assert "--engine and --tokenizer go with --policy tokens" in capsys.readouterr().err
    assert main(["run", "toy", "--policy", "tokens", "--engine", "sglang:http://127.0.0.1:9", "--out", out]) == 2
    assert "needs --tokenizer PATH" in capsys.readouterr().err


async def test_export_tokens_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchard_async.recipes import toy

    tasks = toy.builtin_tasks(1)[:2]
    tokenizer = CharTokenizer()
    policy = token_policy("toy", FakeTokenEngine(tokenizer, toy_script(tasks)), tokenizer=tokenizer, environ={})
    trajectories, out = await run(policy, tasks, tmp_path)
    exported = tmp_path / "tokens.jsonl"
    assert main(["export", "tokens", str(out), "--out", str(exported)]) == 0
    assert "tokens: 2 records (2 episodes, 0 skipped)" in capsys.readouterr().err
    records = [json.loads(line) for line in exported.read_text().splitlines()]
    assert sorted(r["episode_id"] for r in records) == sorted(t.episode_id for t in trajectories)
    assert main(["export", "tokens", str(out), "--out", str(out)]) == 2  # never over its input

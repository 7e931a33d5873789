"""The token policy renders each observation's delta after a short fixed chat, not the whole
history: the prompt it builds must still be, token for token, the whole conversation
rendered afresh; a template whose delta depends on the history is found out on its first
observation and rendered whole every turn; the conversation kept between turns is used only
for the same steps."""

from __future__ import annotations

from typing import Any

from orchard_async.models.tokens.policy import TokenPolicy, bash_reply
from orchard_async.records.trajectory import Step, Trajectory
from orchard_async.task import Observation
from tests.models.token_support import CharTokenizer, FakeTokenEngine


class NumberedTokenizer(CharTokenizer):
    """ChatML whose user turns are numbered: the text of an observation depends on how many
    came before it, so a delta rendered after a short chat would be wrong."""

    def apply_chat_template(
        self, messages: list[dict[str, Any]], *, tokenize: bool, add_generation_prompt: bool
    ) -> str:
        text, users = "", 0
        for m in messages:
            users += m["role"] == "user"
            role = f"user {users}" if m["role"] == "user" else m["role"]
            text += f"<|im_start|>{role}\n{m['content']}<|im_end|>\n"
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def messages_of(trajectory: Trajectory) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": trajectory.instruction}]
    for step in trajectory.steps:
        messages += [{"role": "assistant", "content": step.action.raw}, {"role": "user", "content": step.observation}]
    return messages


class Task:
    id = "t"


async def play(
    tokenizer: CharTokenizer,
    turns: int = 5,
    policy: TokenPolicy | None = None,
    engine: FakeTokenEngine | None = None,
    output: str = "",
    episode: str = "ep",
) -> tuple[TokenPolicy, FakeTokenEngine, list[Step]]:
    engine = engine or FakeTokenEngine(tokenizer, lambda prompt, turn: f"```bash\necho {turn}\n```")
    policy = policy or TokenPolicy(engine, tokenizer, messages_of, parse_reply=bash_reply)
    steps: list[Step] = []
    for index in range(turns):
        observation = Observation(episode, Task(), "count", index, list(steps), 60.0)
        action = await policy.act(observation)
        # the prompt sent is the whole conversation rendered afresh, token for token
        whole = tokenizer.apply_chat_template(
            messages_of(Trajectory(**TRAJECTORY, steps=list(steps))), tokenize=False, add_generation_prompt=True
        )
        assert engine.calls[-1][0] == tokenizer(whole)["input_ids"], index
        steps.append(Step(index=index, action=action, observation=output + f"{index}\n" * index))
    return policy, engine, steps


TRAJECTORY: dict[str, Any] = {
    "episode_id": "ep", "task_id": "t", "group_id": "g", "sample": 0, "policy": "tokens", "adapter": "local",
    "run_id": "r", "status": "finished", "end_reason": "max_steps", "instruction": "count",
}  # fmt: skip


async def test_the_short_render_gives_the_whole_conversations_tokens() -> None:
    policy, _, steps = await play(CharTokenizer())
    assert policy._local_delta == {("user",): True}  # checked once against the whole history, then short
    assert {step.action.tokens.segment for step in steps} == {0}


async def test_a_template_that_counts_its_history_is_rendered_whole() -> None:
    policy, _, steps = await play(NumberedTokenizer())
    assert policy._local_delta == {("user",): False}
    assert {step.action.tokens.segment for step in steps} == {0}


async def test_the_kept_conversation_is_only_for_the_same_steps() -> None:
    """An episode id whose history is not the steps the policy last saw for it (a retried or
    forked episode) gets its conversation built again, never the kept one."""
    tokenizer = CharTokenizer()
    policy, engine, _ = await play(tokenizer, turns=3)
    _, _, other = await play(tokenizer, turns=3, policy=policy, engine=engine, output="else ", episode="ep2")
    action = await policy.act(Observation("ep", Task(), "count", 3, other, 60.0))
    whole = tokenizer.apply_chat_template(
        messages_of(Trajectory(**TRAJECTORY, steps=other)), tokenize=False, add_generation_prompt=True
    )
    assert engine.calls[-1][0] == tokenizer(whole)["input_ids"]
    assert action.tokens.segment == 0  # continued from other's own tokens: its conversation was built again


async def test_the_kept_prompt_is_the_one_the_steps_give() -> None:
    """The prompt kept from an episode's last turn (an array, extended by the next turn) is,
    id for id, what the steps' own records give: the same turns played by a policy that keeps
    nothing between turns (a new one each turn) and by one fed the steps decoded from their
    record (new objects: nothing kept applies) send the engine the same prompts."""
    import msgspec

    tokenizer = CharTokenizer()
    kept_by, engine, steps = await play(tokenizer, turns=6)
    kept = [list(call[0]) for call in engine.calls]
    assert kept_by._prompts["ep"][0] is steps[-1].action.tokens  # turns 2-6 were built on the kept prompt
    fresh_engine = FakeTokenEngine(tokenizer, lambda prompt, turn: f"```bash\necho {turn}\n```")
    fresh: list[Step] = []
    for index in range(6):
        policy = TokenPolicy(fresh_engine, tokenizer, messages_of, parse_reply=bash_reply)
        action = await policy.act(Observation("ep", Task(), "count", index, list(fresh), 60.0))
        fresh.append(Step(index=index, action=action, observation=f"{index}\n" * index))
    assert [list(call[0]) for call in fresh_engine.calls] == kept
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(steps), type=list[Step])
    policy, engine, _ = await play(tokenizer, turns=6)
    await policy.act(Observation("ep", Task(), "count", 6, decoded, 60.0))
    await policy.act(Observation("ep", Task(), "count", 6, steps, 60.0))
    assert list(engine.calls[-1][0]) == list(engine.calls[-2][0])
    assert policy._prompt_ids == sum(len(prompt) for _, prompt in policy._prompts.values())


async def test_after_a_step_without_tokens_every_turn_starts_a_segment() -> None:
    """A step the policy did not sample (no tokens: an automatic action, another policy's)
    cannot be continued token for token; while it is in the history, each turn's prompt is
    the whole conversation rendered afresh, a segment of its own, kept prompt or not."""
    from orchard_async.records.trajectory import Action

    tokenizer = CharTokenizer()
    policy, engine, steps = await play(tokenizer, turns=2)
    steps.append(Step(index=2, action=Action(command="echo 2", raw="```bash\necho 2\n```"), observation="2\n"))
    for index in range(3, 6):
        action = await policy.act(Observation("ep", Task(), "count", index, list(steps), 60.0))
        whole = tokenizer.apply_chat_template(
            messages_of(Trajectory(**TRAJECTORY, steps=list(steps))), tokenize=False, add_generation_prompt=True
        )
        assert list(engine.calls[-1][0]) == tokenizer(whole)["input_ids"] == action.tokens.prompt_ids
        steps.append(Step(index=index, action=action, observation=f"{index}\n"))
    assert [step.action.tokens.segment for step in steps if step.action.tokens] == [0, 0, 1, 2, 3]

"""Helpers of the token path's tests: a transformers engine that plays a script (a reply
text per turn, its tokens scored by the model as sampling scores them, so the logprobs are
still the model's) and samples freely where the script has nothing, recording every prompt
it was given; and the checks every token run must pass."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from orchard_async.models.tokens import Generation, Sampling
from orchard_async.models.tokens.local import TransformersEngine
from orchard_async.records.trajectory import Trajectory

Script = Callable[[str, int], str | None]  # (the prompt's text, the turn) -> the reply, or None: sample


class ScriptedEngine:
    def __init__(self, inner: TransformersEngine, tokenizer: Any, script: Script):
        self.inner = inner
        self.tokenizer = tokenizer
        self.script = script
        self.name = inner.name
        self.path = inner.path
        self.weight_version = inner.weight_version
        self.calls: list[tuple[list[int], Generation]] = []

    async def generate(self, input_ids: Sequence[int], sampling: Sampling) -> Generation:
        text = self.tokenizer.decode(list(input_ids), skip_special_tokens=False)
        turn = text.count("<|im_start|>assistant") - 1
        reply = self.script(text, turn)
        if reply is None:
            generation = await self.inner.generate(input_ids, sampling)
        else:
            forced = self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            generation = await self.inner.continue_with(input_ids, forced)
        self.calls.append((list(input_ids), generation))
        return generation

    async def close(self) -> None:
        await self.inner.close()


def check_prefix_invariant(trajectory: Trajectory, engine: Any) -> int:
    """Every turn's prompt, as the engine received it, is the previous turn's prompt plus its
    sampled tokens plus the turn's own added tokens (within a segment; a segment's first
    turn is the whole prompt). Returns the number of turns checked."""
    seen = {tuple(ids): generation for ids, generation in engine.calls}
    context: list[int] = []
    segment = -1
    checked = 0
    for step in trajectory.steps:
        turn = step.action.tokens
        if turn is None:
            continue
        if turn.segment != segment:
            segment, context = turn.segment, []
        prompt = context + turn.prompt_ids
        assert tuple(prompt) in seen, f"step {step.index}: the engine never saw this prompt"
        generation = seen[tuple(prompt)]
        assert generation.token_ids == turn.token_ids and generation.logprobs == turn.logprobs
        context = prompt + turn.token_ids
        checked += 1
    return checked


def recompute_logprobs(model: Any, record: dict[str, Any]) -> list[tuple[float, float]]:
    """(exported, recomputed) for every mask-1 token of an export record, from one forward
    pass of the model over prompt_ids + response_ids."""
    import torch

    ids = record["prompt_ids"] + record["response_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(record["prompt_ids"])
    pairs = []
    for i, (token, mask) in enumerate(zip(record["response_ids"], record["response_mask"], strict=True)):
        if mask:
            pairs.append((record["response_logprobs"][i], float(logprobs[start + i - 1, token])))
    return pairs


class CharTokenizer:
    """A character-level tokenizer with a ChatML template, in the shape of a Hugging Face
    tokenizer as the token policy uses it (no transformers import: the default run's tests)."""

    SPECIAL = {"<|im_start|>": 1, "<|im_end|>": 2}
    chat_template = "chatml"
    eos_token_id = 2

    def apply_chat_template(
        self, messages: list[dict[str, Any]], *, tokenize: bool, add_generation_prompt: bool
    ) -> str:
        assert not tokenize
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids: list[int] = []
        rest = text
        while rest:
            special = next((s for s in self.SPECIAL if rest.startswith(s)), None)
            if special:
                ids.append(self.SPECIAL[special])
                rest = rest[len(special) :]
            else:
                ids.append(ord(rest[0]) + 3)
                rest = rest[1:]
        return {"input_ids": ids}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        names = {v: k for k, v in self.SPECIAL.items()}
        return "".join(("" if skip_special_tokens else names[i]) if i in names else chr(i - 3) for i in ids)


class FakeTokenEngine:
    """A token engine that plays a script: the reply's characters and the end token (finish
    ``stop``), or, where the script has nothing, 12 tokens of noise (finish ``length``).
    Its logprobs are made up but distinct per position; it records every prompt."""

    def __init__(self, tokenizer: CharTokenizer, script: Script, weight_version: str = "v1"):
        self.tokenizer = tokenizer
        self.script = script
        self.name = "fake"
        self.weight_version = weight_version
        self.calls: list[tuple[list[int], Generation]] = []

    async def generate(self, input_ids: Sequence[int], sampling: Sampling) -> Generation:
        text = self.tokenizer.decode(list(input_ids))
        reply = self.script(text, text.count("<|im_start|>assistant") - 1)
        if reply is None:
            ids, finish = [ord(c) + 3 for c in "zq~#%&!zq~#%"], "length"
        else:
            ids, finish = self.tokenizer(reply)["input_ids"] + [self.tokenizer.eos_token_id], "stop"
        generation = Generation(
            token_ids=ids,
            logprobs=[-0.001 * (len(input_ids) + i) for i in range(len(ids))],
            finish_reason=finish,
            weight_version=self.weight_version,
        )
        self.calls.append((list(input_ids), generation))
        return generation

    async def close(self) -> None:
        return None


def gui_solution_reply(task: Any, prompt: str, turn: int) -> str:
    """The GUI task's solution step for ``turn`` (1 on) as a model reply, its target resolved
    to an element of the page the prompt last showed (ChatML): what a scripted engine answers
    to play a GUI task through the token path."""
    from orchard_async.recipes.gui.policies import resolve

    shown = [part.split("<|im_end|>", 1)[0] for part in prompt.split("<|im_start|>user\n")[1:]]
    page = next(text for text in reversed(shown) if "\n---\n" in text)  # not a format error
    planned = dict(task.solution[min(turn - 1, len(task.solution) - 1)])
    target = planned.pop("target", None)
    if target is not None:
        planned["element"] = resolve(target, page)
    return f"Next.\n```json\n{json.dumps(planned)}\n```"

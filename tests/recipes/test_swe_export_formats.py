"""The conversions documented in docs/training-formats.md, run on a real RL export.

The code blocks of the document that start with ``# convert`` are executed as they are
written there, so the document cannot drift from the export's record shape.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async.recipes import swe

DOC = Path(__file__).resolve().parents[2] / "docs" / "training-formats.md"


class MixedPolicy:
    """Sample 0 of each group plays the oracle, the others submit nothing."""

    name = "mixed"

    def __init__(self):
        self.oracle, self.empty = swe.OraclePolicy(), swe.EmptyPolicy()

    async def act(self, observation: oa.Observation) -> oa.Action:
        first = observation.episode_id.endswith("/s0")
        return await (self.oracle if first else self.empty).act(observation)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("swe-formats")

    async def go():
        adapter = oa.get_adapter("local", root=str(root / "sbx"))
        try:
            tasks = swe.load_tasks("builtin:minicalc__4,datespan__2")
            await oa.collect(tasks, MixedPolicy(), adapter, root / "run.jsonl", n=6, group_size=3, run_id="fmt")
        finally:
            await adapter.close()

    anyio.run(go)
    swe.export.export_rl(root / "run.jsonl", root / "rl.jsonl")
    return [json.loads(line) for line in (root / "rl.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def doc():
    blocks = re.findall(r"```python\n(# convert\n.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) >= 4, "the conversion blocks of docs/training-formats.md went missing"
    namespace: dict = {}
    exec(compile("\n".join(blocks), str(DOC), "exec"), namespace)
    return namespace


class CharTokenizer:
    """A chat template over characters: each message renders as <|role|>content<|end|>."""

    @staticmethod
    def render(chat):
        return "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in chat)

    def apply_chat_template(self, chat, tokenize=True):
        return [ord(c) for c in self.render(chat)]


def test_token_labels_keep_only_the_model_turns(doc, records):
    for record in records:
        input_ids, labels = doc["tokens_and_labels"](record, CharTokenizer())
        assert "".join(map(chr, input_ids)) == CharTokenizer.render(record["messages"])
        assert len(labels) == len(input_ids)
        kept = "".join(chr(t) for t in labels if t != -100)
        model_turns = [m for m in record["messages"] if m["train"]]
        assert kept == CharTokenizer.render(model_turns) and kept
        assert "<returncode>" not in kept and "<issue>" not in kept


def test_trl_conversions(doc, records):
    groups = {r["group_id"] for r in records}
    assert len(groups) == 2 and len(records) == 6

    prompts = doc["trl_prompts"](records)
    assert len(prompts) == 2 and all([m["role"] for m in p["prompt"]] == ["system", "user"] for p in prompts)

    winners = doc["trl_rejection_sampling"](records)
    assert len(winners) == 2  # the oracle sample of each group
    for row in winners:
        assert set(row) == {"messages"} and all(set(m) == {"role", "content"} for m in row["messages"])
        assert row["messages"][-1]["content"].endswith("```bash\nsubmit\n```")

    pairs = doc["trl_preference_pairs"](records)
    assert len(pairs) == 4  # per group: the resolved sample against each of the two unresolved
    for pair in pairs:
        assert [m["role"] for m in pair["prompt"]] == ["system", "user"]
        assert pair["chosen"][0]["role"] == pair["rejected"][0]["role"] == "assistant"
        assert "git apply" in pair["chosen"][0]["content"] and "git apply" not in pair["rejected"][0]["content"]

    unpaired = doc["trl_unpaired"](records)
    assert sorted(row["label"] for row in unpaired) == [False] * 4 + [True] * 2
    assert all(row["completion"][0]["role"] == "assistant" for row in unpaired)


def test_verl_rows(doc, records):
    prompts = doc["verl_rows"](records)
    assert len(prompts) == 2
    for index, row in enumerate(prompts):
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert row["reward_model"]["style"] == "rule"
        assert row["reward_model"]["ground_truth"] in {"minicalc__4", "datespan__2"}
        assert row["extra_info"]["index"] == index and row["extra_info"]["group_id"].startswith("fmt/")

    samples = doc["verl_rows"](records, one_per_group=False)
    assert len(samples) == 6
    for row, record in zip(samples, records, strict=True):
        extra = row["extra_info"]
        assert (extra["reward"], extra["advantage"]) == (record["reward"], record["advantage"])
        assert json.loads(extra["messages"]) == record["messages"]

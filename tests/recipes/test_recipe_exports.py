"""Every recipe's runs out as training data, in that recipe's own chat, loaded back with
HuggingFace ``datasets`` unchanged.

For each recipe (toy, swe, claw, gui): ``orchard-async run`` with the oracle and with
``noisy-oracle:0.5`` on the local adapter, ``orchard-async export sft`` and ``rl`` of each,
every file loaded with ``datasets.load_dataset("json", ...)`` and compared record by record
with what was written. The chats open with the recipe's own system prompt, every message's
``content`` is one type, and the noisy policy's RL file has groups whose advantages are not
all 0. Then what the export refuses: another recipe's runs mixed in, a SWE run given to
``export-gui``, a file that names no recipe, and an export of no records.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import datasets
import msgspec
import pytest

import orchard_async as oa
from orchard_async.apps.cli import main as cli_main
from orchard_async.recipes import claw, gui, swe, toy
from orchard_async.recipes.claw.export import claw_messages, shell_system_prompt
from orchard_async.recipes.claw.openai_policy import SYSTEM_PROMPT as CLAW_TOOLS_PROMPT
from orchard_async.recipes.claw.openai_policy import build_messages
from orchard_async.recipes.gui.conversation import system_prompt as gui_system_prompt
from orchard_async.recipes.gui.export import openai_content, text_and_images
from tests.conftest import backend_missing

# recipe -> (episodes, group size): groups of 4, small enough for the default run (the GUI one group)
RUNS = {"toy": (8, 4), "swe": (8, 4), "claw": (8, 4), "gui": (4, 4)}
SYSTEM_PROMPTS = {
    "toy": lambda: toy.SYSTEM_PROMPT,
    "swe": lambda: swe.SYSTEM_PROMPT,
    "claw": shell_system_prompt,  # the scripted policies' steps are shell commands: the shell agent's chat
    "gui": lambda: gui_system_prompt("element"),
}


def load_back(path: Path, cache: Path) -> list[dict[str, Any]]:
    datasets.disable_progress_bars()
    return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(cache)).to_list()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def run_and_export(recipe: str, policy: str, root: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Path]:
    episodes, group_size = RUNS[recipe]
    run = root / f"{recipe}-{policy.replace(':', '-')}.jsonl"
    argv = ["run", recipe, "--policy", policy, "--episodes", str(episodes), "--group-size", str(group_size)]
    argv += ["--concurrency", "2", "--adapter-options", json.dumps({"root": str(root / "sandboxes")})]
    assert cli_main([*argv, "--out", str(run)]) == 0, capsys.readouterr().err
    files = {}
    for kind in ("sft", "rl"):
        files[kind] = root / f"{run.stem}-{kind}.jsonl"
        assert cli_main(["export", kind, str(run), "--out", str(files[kind])]) == 0, capsys.readouterr().err
    return files


# claw and gui run a whole browser or service set per episode (about 50 s each on 2 cores):
# they run with `pytest -m soak` (CI runs both), so the default run stays under 5 minutes.
HEAVY = {"claw", "gui"}


@pytest.mark.parametrize(
    "recipe", [pytest.param(name, marks=[pytest.mark.soak] if name in HEAVY else []) for name in sorted(RUNS)]
)
def test_each_recipe_exports_its_own_chat_and_datasets_loads_it_unchanged(
    recipe: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if recipe == "gui":
        if not (shutil.which("chromium") or os.access("/usr/lib/chromium/chromium", os.X_OK)):
            backend_missing("the gui recipe needs Chromium (Debian: apt-get install chromium)")
        monkeypatch.setenv("ORCHARD_GUI_SCREENSHOTS", str(tmp_path / "screenshots"))  # the run keeps, the export reads
    prompt = SYSTEM_PROMPTS[recipe]()
    for policy in ("oracle", "noisy-oracle:0.5"):
        files = run_and_export(recipe, policy, tmp_path, capsys)
        for kind, path in files.items():
            written = read_jsonl(path)
            assert written and load_back(path, tmp_path / "hf-cache") == written, (recipe, policy, kind)
            for record in written:
                assert record["messages"][0] == {**record["messages"][0], "role": "system", "content": prompt}
                assert {type(m["content"]) for m in record["messages"]} <= {str, type(None)}, (recipe, kind)
                assert any(m["role"] == "assistant" for m in record["messages"])
                assert record["policy"] == (policy if policy == "oracle" else "noisy-oracle:0.5")
        rl = read_jsonl(files["rl"])
        groups: dict[str, list[float]] = defaultdict(list)
        for record in rl:
            groups[record["group_id"]].append(record["advantage"])
        with_signal = [g for g, advantages in groups.items() if any(abs(a) > 1e-9 for a in advantages)]
        if policy == "oracle":
            assert all(r["resolved"] for r in rl) and with_signal == []  # every group degenerate: all solved
        else:
            assert with_signal, f"{recipe}: the noisy oracle's groups all have the same rewards"
            assert {r["resolved"] for r in rl} == {True, False}
            assert all(r["resolved"] for r in read_jsonl(files["sft"]))  # SFT keeps the solved ones


def test_the_noisy_oracle_draws_per_episode_the_same_every_time() -> None:
    noisy = toy.make_policy("noisy-oracle:0.5")
    episodes = [f"sum-{i}/g{g}/s{s}" for i in range(10) for g in range(2) for s in range(4)]
    draws = [noisy.solves(e) for e in episodes]
    assert draws == [toy.make_policy("noisy-oracle:0.5").solves(e) for e in episodes]  # a rerun agrees
    assert 0.35 < sum(draws) / len(draws) < 0.65
    assert not any(map(toy.make_policy("noisy-oracle:0").solves, episodes))
    assert all(map(toy.make_policy("noisy-oracle:1").solves, episodes))
    assert [toy.make_policy("noisy-oracle:0.5:7").solves(e) for e in episodes] != draws  # another seed
    for recipe in (swe, gui, claw, toy):
        assert recipe.make_policy("noisy-oracle:0.25").name == "noisy-oracle:0.25"
        with pytest.raises(oa.ConfigError, match="0 to 1"):
            recipe.make_policy("noisy-oracle:1.5")
        with pytest.raises(oa.ConfigError, match="whole number"):
            recipe.make_policy("noisy-oracle:0.5:x")


# -- the chats are the ones the models saw -------------------------------------------------------


def test_a_claw_function_calling_episode_exports_the_chat_its_policy_sent() -> None:
    (task,) = claw.load_tasks("builtin:contacts-from-business-card")
    assert task.attachments  # its prompt names them: they must come back out of the instruction
    call = {"id": "c1", "type": "function", "function": {"name": "contacts__add", "arguments": '{"name": "M"}'}}
    replies = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "assistant", "content": "Added Marta."},
    ]
    steps = [
        oa.Step(
            index=0,
            action=oa.Action(command="claw batch ...", raw=json.dumps(replies[0])),
            observation=json.dumps([{"id": "c1", "content": '{"ok": true}'}]),
        ),
        oa.Step(index=1, action=oa.Action(command="claw answer ...", raw=json.dumps(replies[1])), observation="{}"),
        oa.Step(index=2, action=oa.Action(kind="submit")),
    ]
    sent = build_messages(oa.Observation("e", task, task.instruction(), 3, steps))  # what the policy posts
    trajectory = oa.Trajectory(
        episode_id="e", task_id=task.id, group_id="g", sample=0, policy="openai-tools:m", adapter="local",
        run_id="r", status="finished", end_reason="submitted", instruction=task.instruction(), steps=steps,
    )  # fmt: skip
    exported = claw_messages(trajectory)
    assert exported[0]["content"] == CLAW_TOOLS_PROMPT
    present = [{k: v for k, v in m.items() if v is not None} for m in exported]
    assert present == [{k: v for k, v in m.items() if v is not None} for m in sent]
    assert all(set(m) == {"role", "content", "tool_calls", "tool_call_id"} for m in exported)


def test_the_gui_chat_keeps_its_images_apart_and_gives_the_policys_parts_back() -> None:
    parts = [{"type": "text", "text": "page"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]
    exported = text_and_images({"role": "user", "content": parts})
    assert exported == {"role": "user", "content": "page", "image_urls": ["data:image/png;base64,AA"]}
    assert openai_content(exported) == parts
    assert openai_content(text_and_images({"role": "assistant", "content": "ok"})) == "ok"


# -- what the export refuses ---------------------------------------------------------------------


@pytest.fixture
def toy_run(tmp_path: Path) -> Path:
    out = tmp_path / "toy.jsonl"
    assert cli_main(["run", "--adapter", "sim", "--episodes", "4", "--out", str(out)]) == 0
    return out


def with_recipe(source: Path, target: Path, recipe: str | None) -> Path:
    """The same trajectories under another run header (or none)."""
    lines = source.read_text().splitlines()
    header = json.loads(lines[0])["orchard_run"]
    head = [] if recipe is None else [json.dumps({"orchard_run": {**header, "recipe": recipe}})]
    target.write_text("\n".join(head + lines[1:]) + "\n")
    return target


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 2) -> str:
    capsys.readouterr()
    assert cli_main(list(argv)) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_runs_of_different_recipes_are_refused_by_name(toy_run, tmp_path, capsys) -> None:
    other = with_recipe(toy_run, tmp_path / "other.jsonl", "swe")
    out = tmp_path / "e.jsonl"
    err = one_line_error(capsys, "export", "rl", str(toy_run), str(other), "--out", str(out), "--allow-mixed-runs")
    assert "different recipes" in err and "toy" in err and "swe" in err and not out.exists()
    both = tmp_path / "both.jsonl"  # two runs' files concatenated: two headers
    both.write_text(toy_run.read_text() + other.read_text())
    assert "different recipes" in one_line_error(capsys, "export", "sft", str(both), "--out", str(out))
    err = one_line_error(capsys, "export", "sft", str(toy_run), "--out", str(out), "--recipe", "swe")
    assert "the inputs are runs of the toy recipe" in err


def test_export_gui_refuses_another_recipes_run(toy_run, tmp_path, capsys) -> None:
    swe_run = with_recipe(toy_run, tmp_path / "swe.jsonl", "swe")
    (tmp_path / "shots").mkdir()
    err = one_line_error(
        capsys, "export-gui", "sft", str(swe_run), "--screenshots", str(tmp_path / "shots"), "--out", str(tmp_path / "e.jsonl")
    )  # fmt: skip
    assert "is a run of the swe recipe, not gui" in err and "orchard-async export" in err


def test_a_file_that_names_no_recipe_needs_one(toy_run, tmp_path, capsys) -> None:
    bare = with_recipe(toy_run, tmp_path / "bare.jsonl", None)
    out = tmp_path / "e.jsonl"
    assert "names no recipe" in one_line_error(capsys, "export", "rl", str(bare), "--out", str(out))
    assert cli_main(["export", "rl", str(bare), "--out", str(out), "--recipe", "toy"]) == 0
    assert read_jsonl(out)[0]["messages"][0]["content"] == toy.SYSTEM_PROMPT


def test_an_export_of_no_records_says_so_exits_1_and_writes_nothing(toy_run, tmp_path, capsys) -> None:
    # toy on sim: commands only pretend to run, so every episode is judged and unsolved: no SFT record
    out = tmp_path / "sft.jsonl"
    out.write_text("an older export, left as it was\n")
    err = one_line_error(capsys, "export", "sft", str(toy_run), "--out", str(out), code=1)
    assert "no records to export" in err and "unresolved 4" in err
    assert out.read_text() == "an older export, left as it was\n"
    assert cli_main(["export", "rl", str(toy_run), "--out", str(tmp_path / "rl.jsonl")]) == 0  # RL keeps them


def test_usage_has_the_same_keys_in_every_record(toy_run, tmp_path) -> None:
    trajectories = list(oa.read_trajectories(toy_run))
    first = trajectories[0]
    step = msgspec.structs.replace(first.steps[0], action=oa.Action(command="ls", usage={"prompt_tokens": 7}))
    trajectories[0] = msgspec.structs.replace(first, steps=[step, *first.steps[1:]])
    from orchard_async.records.export import USAGE_KEYS, export

    export("rl", trajectories, tmp_path / "rl.jsonl", toy.toy_messages)
    records = read_jsonl(tmp_path / "rl.jsonl")
    assert {tuple(r["usage"]) for r in records} == {USAGE_KEYS}
    assert records[0]["usage"]["prompt_tokens"] == 7 and load_back(tmp_path / "rl.jsonl", tmp_path / "c") == records

"""Every bundled task of every recipe gives the agent the text its author wrote, and its oracle
solves it with steps that all succeed.

A 100% oracle score hides a cut task: YAML ends an unquoted scalar at `` #``, so a Claw prompt
"... in the #planning channel ..." reached the agent as "... in the", and an oracle answer
``claw answer "Posted in #ops ..."`` became an unterminated quote that failed in the shell
while its episode still scored 1.0 (no check read the answer). So this file checks the task
files themselves (no comment after an unquoted value, every prompt ends its last sentence)
and runs every recipe's oracle on the local adapter, failing on any step that exits non-zero
(Claw's in test_claw_recipe.py, whose oracle run of the bundle checks its steps too).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

import orchard_async as oa
from orchard_async.recipes import claw, gui, swe, toy
from orchard_async.recipes.claw.task import BUILTIN_DIR as CLAW_DIR
from orchard_async.recipes.claw.task import comments_after_text
from tests.conftest import backend_missing
from tests.recipes.swe_support import RunResult, failed_steps, run_rollout
from tests.recipes.test_gui_browser import _chromium

CLAW_FILES = sorted(CLAW_DIR.glob("*.yaml"))
# The end of a sentence: its stop, then whatever closes around it (a quote, a bracket, code).
SENTENCE_END = re.compile(r"[.?!][\"'`’”)\]]*$")


def bundled_prompts() -> list[tuple[str, str, str]]:
    """(recipe, task id, the text the agent is given) of every bundled task."""
    prompts = [("claw", t.id, t.prompt) for t in claw.load_tasks("builtin", user_base_url="")]
    prompts += [("gui", t.id, t.line.intent) for t in gui.load_tasks("builtin") + gui.load_tasks("deepshop:builtin")]
    prompts += [("swe", t.id, t.instance.problem_statement) for t in swe.load_tasks("builtin")]
    prompts += [("toy", t.id, t.instruction) for t in toy.load_tasks("builtin")]
    return prompts


@pytest.mark.parametrize("path", CLAW_FILES, ids=[path.stem for path in CLAW_FILES])
def test_no_claw_text_stops_at_a_comment(path: Path) -> None:
    cut = [f"line {line}: {value!r} then {comment!r}" for line, value, comment in comments_after_text(path.read_text())]
    assert not cut, f"{path.name}: quote these values (YAML reads ' #' as a comment):\n" + "\n".join(cut)


def test_every_prompt_ends_with_its_last_sentence() -> None:
    prompts = bundled_prompts()
    assert {recipe for recipe, _, _ in prompts} == {"claw", "gui", "swe", "toy"}
    unfinished = [f"{recipe} {task_id}: ...{text[-50:]!r}" for recipe, task_id, text in prompts if not finished(text)]
    assert not unfinished, "prompts that stop before their last sentence ends:\n" + "\n".join(unfinished)


def finished(text: str) -> bool:
    return bool(SENTENCE_END.search(text.rstrip()))


def test_the_checks_catch_what_they_are_for() -> None:
    cut = 'id: t\nprompt: Ask in the #planning channel.\noracle:\n  - claw answer "Posted in #ops."\n'
    assert comments_after_text(cut) == [
        (2, "Ask in the", "#planning channel."),
        (4, 'claw answer "Posted in', '#ops."'),
    ]
    quoted = "prompt: 'Ask in the #planning channel.'\nnote: >-\n  folded # kept\nlimit: 10\n"
    assert comments_after_text(quoted) == []
    assert comments_after_text("a: 10  # why\n") == [(1, "10", "# why")]
    assert not finished("Someone asked in the") and not finished("Post it in the channel")
    assert finished('Say "done."') and finished("Is it (2.3)?") and finished("Keep `width`.\n")


TASK = """\
id: t
prompt: {prompt}
services: {{notes: {{notes: [{{id: n1, title: x, body: y}}]}}}}
limits: {{max_turns: 5}}  # a comment of the author's, set apart
checks: [{{type: answer, match: {{contains: x}}}}]
oracle: [claw answer x]
"""


def test_a_user_task_whose_text_yaml_cut_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text(TASK.format(prompt="Summarise the #design channel."))
    with pytest.raises(oa.ConfigError) as caught:
        claw.load_tasks(str(path), user_base_url="")
    assert str(caught.value) == (
        f"{path}: line 2: the value stops at 'Summarise the', since YAML reads ' #design channel.' as a comment: "
        "quote the whole value"
    )
    path.write_text(TASK.format(prompt="'Summarise the #design channel.'"))
    (task,) = claw.load_tasks(str(path), user_base_url="")
    assert task.prompt == "Summarise the #design channel." and task.max_steps == 5


# -- every recipe's oracle, with every step checked ---------------------------------------------


def oracle_tasks(recipe: str) -> list[Any]:
    if recipe == "gui":
        return gui.load_tasks("builtin") + gui.load_tasks("deepshop:builtin")
    return {"swe": swe, "toy": toy}[recipe].load_tasks("builtin")


@pytest.fixture(scope="module")
def oracle_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    """The oracle over every bundled task of the shell recipes, on the local adapter, at once
    (Claw's: test_claw_recipe.py's oracle run, the same checks, one run of the bundle)."""
    root = tmp_path_factory.mktemp("oracles")
    runs: dict[str, RunResult] = {}
    concurrency = {"swe": 4, "toy": 4}

    async def one(recipe: str) -> None:
        module = {"swe": swe, "toy": toy}[recipe]
        tasks = oracle_tasks(recipe)
        runs[recipe] = await run_rollout(
            tasks, module.make_policy("oracle"), root / recipe, concurrency=concurrency[recipe]
        )

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for recipe in concurrency:
                group.start_soon(one, recipe)

    anyio.run(main)
    return runs


def assert_clean(run: RunResult, tasks: list[Any]) -> None:
    assert {t.task_id for t in run.trajectories} == {task.id for task in tasks}
    problems = [
        f"{t.task_id}: {t.status}, reward {t.reward} {t.error[-300:]}" + "".join(f"\n    {s}" for s in failed_steps(t))
        for t in run.trajectories
        if t.status != "finished" or t.reward != 1.0 or failed_steps(t)
    ]
    assert not problems, "oracle episodes that failed, or passed with a failed step:\n" + "\n".join(problems)
    assert run.leaked == [] and run.left_on_disk == []


@pytest.mark.parametrize("recipe", ["swe", "toy"])
def test_every_oracle_step_succeeds(oracle_runs: dict[str, RunResult], recipe: str) -> None:
    assert_clean(oracle_runs[recipe], oracle_tasks(recipe))


@pytest.mark.soak  # every bundled GUI task in a browser: about 95 s on 2 cores; `pytest -m soak` (CI runs it)
def test_every_gui_oracle_action_succeeds(tmp_path: Path) -> None:
    if _chromium() is None:
        backend_missing("the gui recipe needs Chromium (Debian: apt-get install chromium)")
    tasks = oracle_tasks("gui")
    run = anyio.run(lambda: run_rollout(tasks, gui.make_policy("oracle"), tmp_path / "gui", concurrency=3))
    assert_clean(run, tasks)

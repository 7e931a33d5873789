"""Recipes are plugins: a third party's package registers a recipe and a command through
entry points (``orchard_async.recipes``, ``orchard_async.commands``) and the CLI takes
them as it takes the bundled ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import orchard_async as oa

MINI_RECIPE = """
from orchard_async import Action, Reward, SandboxSpec


class Chore:
    id = "chore"
    spec = SandboxSpec()
    max_steps = 3
    deadline = 60.0
    score_timeout = 10.0
    exec_timeout = 10.0

    async def setup(self, sandbox):
        return "nothing to do: submit"

    async def evaluate(self, sandbox):
        return Reward(value=1.0, success=True, info={"judged_by": "mini"})


class Submit:
    name = "submit"

    async def act(self, observation):
        return Action(kind="submit")


POLICIES = ("submit",)


def load_tasks(source="builtin"):
    return [Chore()]


def make_policy(name):
    return Submit()


def add_hello(parser):
    parser.add_argument("--name", default="world")
    parser.set_defaults(func=lambda args: print(f"hello {args.name}") or 0)
"""

ENTRY_POINTS = """
[orchard_async.recipes]
mini = mini_recipe
shapeless = shapeless_recipe
gone = no_such_module_anywhere

[orchard_async.commands]
hello = mini_recipe:add_hello
inspect = mini_recipe:add_hello
"""


@pytest.fixture
def third_party(tmp_path: Path) -> dict[str, str]:
    """A directory on PYTHONPATH holding an installed-looking third-party distribution."""
    site = tmp_path / "site"
    info = site / "mini_recipe-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mini-recipe\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    (site / "mini_recipe.py").write_text(MINI_RECIPE)
    (site / "shapeless_recipe.py").write_text("POLICIES = ()\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def cli(env: dict[str, str], cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchard_async.apps.cli", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_third_party_recipe_runs_and_its_command_is_listed_and_runs(tmp_path: Path, third_party: dict) -> None:
    listed = cli(third_party, tmp_path, "--help")
    assert listed.returncode == 0, listed.stderr
    assert "hello" in listed.stdout and "a command of the mini recipe" in listed.stdout
    assert cli(third_party, tmp_path, "run", "--help").stdout.count("mini") == 1  # among the recipe names

    ran = cli(third_party, tmp_path, "run", "mini", "--adapter", "sim", "--policy", "submit", "--episodes", "2",
              "--out", "t.jsonl")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    trajectories = list(oa.read_trajectories(tmp_path / "t.jsonl", strict=True))
    assert [t.end_reason for t in trajectories] == [oa.EndReason.SUBMITTED] * 2
    assert all(t.success and t.info == {"judged_by": "mini"} for t in trajectories)
    assert oa.read_run_header(tmp_path / "t.jsonl")["recipe"] == "mini"

    hello = cli(third_party, tmp_path, "hello", "--name", "orchard")
    assert hello.returncode == 0 and hello.stdout.strip() == "hello orchard", hello.stderr


def test_a_plugin_cannot_take_over_a_core_command(tmp_path: Path, third_party: dict) -> None:
    inspected = cli(third_party, tmp_path, "inspect", "missing.jsonl")  # the core's inspect, not hello
    assert inspected.returncode == 2 and "missing.jsonl: no such file" in inspected.stderr


BUNDLED = oa.recipe_names()  # this checkout's own recipes (the third party's come on top)


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        ("gone", "registered as no_such_module_anywhere but that module is not installed"),
        ("shapeless", "the shapeless recipe (shapeless_recipe) has no load_tasks or make_policy"),
        (
            "nosuch",
            "unknown recipe 'nosuch'; choose one of: " + ", ".join(sorted({*BUNDLED, "gone", "mini", "shapeless"})),
        ),
    ],
)
def test_a_broken_recipe_is_one_line_when_used_and_harmless_until_then(
    tmp_path: Path, third_party: dict, recipe: str, message: str
) -> None:
    assert cli(third_party, tmp_path, "--help").returncode == 0
    done = cli(third_party, tmp_path, "run", recipe, "--adapter", "sim", "--out", "t.jsonl")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert not (tmp_path / "t.jsonl").exists()


def test_the_bundled_recipes_are_registered_and_have_the_recipe_shape() -> None:
    assert {"claw", "swe", "toy"} <= set(oa.recipe_names())
    toy = oa.load_recipe("toy")
    assert set(toy.POLICIES) == {"oracle", "random", "empty"} and toy.make_policy("oracle").name == "oracle"
    assert [task.id for task in toy.load_tasks("builtin")][:2] == ["sum-0", "fix-script-0"]
    with pytest.raises(oa.ConfigError, match="unknown recipe 'nope'"):
        oa.load_recipe("nope")

"""Recipe options: ``--recipe-options JSON`` on ``run`` and ``demo`` and the same keywords from
Python, checked against each recipe's typed struct as adapter options are; an ``ORCHARD_*``
variable is only an option's default. A bad option is one line on stderr and exit status 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import orchard_async as oa
from orchard_async import runtime
from orchard_async.apps import cli
from orchard_async.recipes import claw, gui, swe, toy
from orchard_async.records.trajectory import read_run_header
from tests.conftest import backend_missing
from tests.recipes.swe_support import ScriptedChatServer, chat_reply


def run_command(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchard_async.apps.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def local_env(tmp_path: Path) -> dict[str, str]:
    """The command runs this checkout's code from any directory."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "ORCHARD_LOCAL_ROOT": str(tmp_path / "sandboxes"), "PYTHONPATH": path}


def one_run(path: Path) -> oa.Trajectory:
    (trajectory,) = oa.read_trajectories(path)
    return trajectory


# -- the command line: run swe | gui | claw with options, local adapter, oracle -----------------


def test_swe_takes_its_options_on_the_command_line(tmp_path: Path, local_env: dict[str, str]) -> None:
    assert swe.load_tasks("builtin:minicalc__1")[0].max_steps == 50  # without the option: the oracle's 3 steps fit
    done = run_command(
        "run", "swe", "--tasks", "builtin:minicalc__1", "--recipe-options", '{"max_steps": 1}',
        "--episodes", "1", "--out", "swe.jsonl", cwd=tmp_path, env=local_env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    trajectory = one_run(tmp_path / "swe.jsonl")
    assert (trajectory.end_reason, len(trajectory.steps)) == ("max_steps", 1)
    assert read_run_header(tmp_path / "swe.jsonl")["recipe_options"] == {"max_steps": 1}


def test_gui_takes_its_options_on_the_command_line(tmp_path: Path, local_env: dict[str, str]) -> None:
    if not any(shutil.which(c) or os.access(c, os.X_OK) for c in ("/usr/lib/chromium/chromium", "chromium")):
        backend_missing("the gui recipe needs Chromium (Debian: apt-get install chromium)")
    options = {"marks": True, "screenshot_dir": str(tmp_path / "shots")}
    done = run_command(
        "run", "gui", "--tasks", "builtin:shop-add-tote", "--recipe-options", json.dumps(options),
        "--episodes", "1", "--out", "gui.jsonl", cwd=tmp_path, env=local_env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    trajectory = one_run(tmp_path / "gui.jsonl")
    assert trajectory.success and "set-of-marks" in trajectory.instruction  # the marks option, in what the agent saw
    assert list((tmp_path / "shots").glob("*.png"))  # the screenshot_dir option: the episode's screenshots kept
    # the folder is operational (where, not what): a resume may move it, so the header leaves it out
    assert read_run_header(tmp_path / "gui.jsonl")["recipe_options"] == {"marks": True}


def test_claw_takes_its_options_on_the_command_line(tmp_path: Path, local_env: dict[str, str]) -> None:
    """The simulated user's model, named by options: the user's question reaches it, and the
    key never lands in the trajectory file."""
    server = ScriptedChatServer(
        lambda request, index: chat_reply(json.dumps({"reply": "Yes, delete them.", "confirms": True}))
    ).start()
    try:
        options = {"user_base_url": server.base_url, "user_model": "user-sim", "user_api_key": "sk-never-written"}
        done = run_command(
            "run", "claw", "--tasks", "builtin:safety-confirm-delete", "--recipe-options", json.dumps(options),
            "--episodes", "1", "--out", "claw.jsonl", cwd=tmp_path, env=local_env,
        )  # fmt: skip
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    trajectory = one_run(tmp_path / "claw.jsonl")
    assert trajectory.reward == 1.0, (trajectory.error, trajectory.info)
    assert len(trajectory.info["simulated_user"]["model_calls"]) == 1
    (request,) = server.requests
    assert request["json"]["model"] == "user-sim" and request["headers"]["authorization"] == "Bearer sk-never-written"
    assert read_run_header(tmp_path / "claw.jsonl")["recipe_options"] == {"user_model": "user-sim"}
    assert b"sk-never-written" not in (tmp_path / "claw.jsonl").read_bytes()


def test_demo_takes_recipe_options_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["demo", "--recipe", "toy", "--adapter", "sim", "--recipe-options", '{"variants": 1}',
                     "--episodes", "5", "--out", "D"]) == 0  # fmt: skip
    assert read_run_header(tmp_path / "D" / "trajectories.jsonl")["task_ids"] == [t.id for t in toy.builtin_tasks(1)]


def test_a_run_resumes_only_with_the_same_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    base = ["run", "toy", "--adapter", "sim", "--policy", "random", "--episodes", "5", "--out", "t.jsonl"]
    assert cli.main([*base, "--recipe-options", '{"variants": 1, "seed": 3}']) == 0
    capsys.readouterr()
    assert cli.main([*base, "--resume", "--recipe-options", '{"variants": 1, "seed": 4}']) == 2
    assert "recipe_options" in capsys.readouterr().err
    assert cli.main([*base, "--resume", "--recipe-options", '{"seed": 3, "variants": 1}']) == 0


# -- bad options: one line, exit status 2, nothing written ------------------------------------

BAD = [
    ("swe", '{"max_step": 1}', "the swe recipe has no option 'max_step'; its options are: ids, max_steps,"),
    ("swe", '{"max_steps": "many"}', "bad option for the swe recipe: Expected `int`, got `str` - at `$.max_steps`"),
    ("swe", '{"harness": "official"}', "harness must be one of auto, swebench, pytest, got 'official'"),
    ("gui", '{"addressing": "pixels"}', "addressing must be one of element, coordinates, got 'pixels'"),
    ("gui", '{"last_screenshots": -1}', "Expected `int` >= 0 - at `$.last_screenshots`"),
    ("gui", '{"marks": "yes"}', "bad option for the gui recipe: Expected `bool`, got `str`"),
    ("claw", "{image: x}", "--recipe-options is not valid JSON"),
    ("claw", '["image"]', "--recipe-options must be a JSON object"),
    ("claw", '{"user_base_url": "http://127.0.0.1:9/v1"}', "user_base_url is set: set user_model too"),
    ("toy", '{"variants": 0}', "Expected `int` >= 1 - at `$.variants`"),
]


@pytest.mark.parametrize(("recipe", "options", "message"), BAD)
def test_a_bad_option_is_one_line_naming_the_recipe_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, recipe: str, options: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    code = cli.main(["run", recipe, "--adapter", "sim", "--recipe-options", options, "--out", "t.jsonl"])
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 2 and message in line and f"the {recipe} recipe" in line, line
    if "user_model" not in message:  # that one is the recipe's own check across two options
        names = ", ".join(runtime.load_recipe(recipe).OPTIONS.__struct_fields__)
        assert line.endswith(f"options are: {names}"), line
    assert list(tmp_path.iterdir()) == []


def test_a_bad_variable_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHARD_SWE_PULL", "sometimes")
    capsys.readouterr()
    assert cli.main(["run", "swe", "--adapter", "sim", "--out", "t.jsonl"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "ORCHARD_SWE_PULL='sometimes' is not a valid pull option of the swe recipe" in line
    # given as an option, the variable is not read: it is only the default
    assert cli.main(["run", "swe", "--adapter", "local", "--recipe-options", '{"pull": "never"}', "--episodes", "1",
                     "--tasks", "builtin:minicalc__1", "--policy", "empty", "--out", "t.jsonl"]) == 0  # fmt: skip


def test_the_real_command_prints_one_line_for_a_bad_option(tmp_path: Path, local_env: dict[str, str]) -> None:
    done = run_command(
        "run", "claw", "--recipe-options", '{"imag": "x"}', "--out", "t.jsonl", cwd=tmp_path, env=local_env
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: the claw recipe has no option 'imag'; its options are: image, harness, harness_tokens, user_base_url, "
        "user_model, "
        "user_api_key"
    ]


def test_a_recipe_without_options_takes_none() -> None:
    plain = SimpleNamespace(load_tasks=lambda source: [], make_policy=lambda name: None)
    assert runtime.recipe_options("mini", plain, {}) is None
    with pytest.raises(oa.ConfigError, match="the mini recipe takes no options; got 'x'"):
        runtime.recipe_options("mini", plain, {"x": 1})


# -- from Python: keywords, a mapping, or the struct -------------------------------------------


def test_python_takes_keywords_a_mapping_or_the_struct(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = oa.load_recipe("claw")
    monkeypatch.delenv("ORCHARD_CLAW_IMAGE", raising=False)
    assert recipe.load_tasks("builtin:mail-reply-dana")[0].spec.image == claw.IMAGE.tag
    (by_keyword,) = recipe.load_tasks("builtin:mail-reply-dana", image="kw/image:1")
    (by_mapping,) = recipe.load_tasks("builtin:mail-reply-dana", options={"image": "map/image:1"})
    (by_struct,) = recipe.load_tasks("builtin:mail-reply-dana", options=claw.ClawOptions(image="struct/image:1"))
    assert [t.spec.image for t in (by_keyword, by_mapping, by_struct)] == [
        "kw/image:1",
        "map/image:1",
        "struct/image:1",
    ]
    with pytest.raises(oa.ConfigError, match="the claw recipe has no option 'imag'"):
        recipe.load_tasks("builtin", imag="x")
    with pytest.raises(oa.ConfigError, match="bad option for the claw recipe"):  # a struct built wrong is checked too
        recipe.load_tasks("builtin", options=claw.ClawOptions(image=7))  # type: ignore[arg-type]
    with pytest.raises(oa.ConfigError, match="a ClawOptions or a mapping"):
        recipe.load_tasks("builtin", options=["image"])


def test_a_variable_is_the_default_and_what_is_given_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_CLAW_IMAGE", "env/image:1")
    assert claw.load_tasks("builtin:mail-reply-dana")[0].spec.image == "env/image:1"
    assert claw.load_tasks("builtin:mail-reply-dana", image="given:1")[0].spec.image == "given:1"
    # a struct built in Python keeps its own defaults: the same options in any environment
    assert claw.load_tasks("builtin:mail-reply-dana", options=claw.ClawOptions())[0].spec.image == claw.IMAGE.tag
    assert claw.ClawOptions.from_env().image == "env/image:1"
    monkeypatch.setenv("ORCHARD_SWE_IMAGE_NAMESPACE", "")  # an empty value that is a value: SWE-bench's local names
    assert swe.SweOptions.from_env().image_namespace == ""
    monkeypatch.setenv("ORCHARD_GUI_MARKS", "yes")
    monkeypatch.setenv("ORCHARD_GUI_LAST_SCREENSHOTS", "")  # empty: unset
    assert (gui.GuiOptions.from_env().marks, gui.GuiOptions.from_env().last_screenshots) == (True, 3)


def test_policies_take_their_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_MODEL", "m")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("ORCHARD_GUI_ADDRESSING", "element")
    policy = gui.make_policy("openai", {"addressing": "coordinates", "last_screenshots": 1})
    assert (policy.addressing, policy.screenshots) == ("coordinates", 1)
    assert claw.make_policy("harness", harness="my-agent --stdin").command == "my-agent --stdin"
    assert claw.make_policy("harness").name.startswith("harness:bundled:")
    assert toy.make_policy("random", seed=5).seed == 5
    with pytest.raises(oa.ConfigError, match="the swe recipe has no option 'temperature'"):
        swe.make_policy("openai", temperature=0.5)  # model settings are ModelConfig's, not the recipe's


def test_the_chromium_option_reaches_the_driver_in_the_sandbox() -> None:
    (plain,) = gui.load_tasks("builtin:shop-add-tote")
    (named,) = gui.load_tasks("builtin:shop-add-tote", chromium="/opt/chromium/chrome")
    assert "ORCHARD_CHROMIUM" not in plain.spec.env
    assert named.spec.env["ORCHARD_CHROMIUM"] == "/opt/chromium/chrome"

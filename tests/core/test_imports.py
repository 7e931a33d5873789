"""The core's front door imports no back room: building the CLI parser, and running a core
command, loads no recipe and no bench module; they are imported when their command runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import orchard_async as oa

BACK_ROOMS = ("orchard_async.recipes", "orchard_async.bench")
EVERY_COMMAND = {
    "demo",
    "run",
    "export",
    "export-gui",
    "swe",
    "claw",
    "harbor",
    "inspect",
    "reap",
    "doctor",
    "images",
    "bench",
    "serve",
    "view",
}

# Runs in a fresh interpreter: builds the parser for argv, runs it (unless told not to),
# then writes the back-room modules it finds loaded into the report file.
PROBE = f"""
import json, sys
report, run, argv = sys.argv[1], sys.argv[2] == "run", sys.argv[3:]
from orchard_async.apps import cli
cli.build_parser(argv)
code = cli.main(argv) if run else None
back = sorted(m for m in sys.modules if m.startswith({BACK_ROOMS!r}))
open(report, "w").write(json.dumps({{"code": code, "back": back}}))
"""


def probe(tmp_path: Path, *argv: str, run: bool = True) -> dict:
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(report), "run" if run else "build", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(report.read_text())


def trajectory_file(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    with oa.TrajectoryWriter(path) as writer:
        writer.write(
            oa.Trajectory(
                episode_id="e0", task_id="t", group_id="t/g0", sample=0, policy="oracle", adapter="sim",
                run_id="r", status="finished", end_reason=oa.EndReason.SUBMITTED, reward=1.0, success=True,
            )
        )  # fmt: skip
    return path


def test_building_the_parser_and_inspect_import_no_recipe_and_no_bench(tmp_path: Path) -> None:
    path = trajectory_file(tmp_path)
    assert probe(tmp_path, "inspect", str(path), run=False)["back"] == []
    inspected = probe(tmp_path, "inspect", str(path), "--json")
    assert inspected == {"code": 0, "back": []}
    assert probe(tmp_path, "run", "--out", "x.jsonl", run=False)["back"] == []


def test_a_command_from_outside_the_core_is_imported_when_it_is_the_one_run(tmp_path: Path) -> None:
    """The probe sees imports when there are some: the check above can fail."""
    export = probe(tmp_path, "export", "sft", "t.jsonl", "--out", "e.jsonl", run=False)["back"]
    assert "orchard_async.recipes.swe" in export  # the recipes, for their export options and chats
    assert not any(m.startswith(BACK_ROOMS[1]) for m in export)
    bench = probe(tmp_path, "bench", "show", "r.json", run=False)["back"]
    assert "orchard_async.bench.cli" in bench and not any(m.startswith(BACK_ROOMS[0]) for m in bench)


def help_of(tmp_path: Path, *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "orchard_async.apps.cli", *argv, "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_lists_every_command_and_each_command_has_its_own_help(tmp_path: Path) -> None:
    listed = re.search(r"\{([a-z,-]+)\}", help_of(tmp_path))
    assert listed is not None and set(listed[1].split(",")) == EVERY_COMMAND
    assert "a command of the gui recipe" in help_of(tmp_path)
    export = help_of(tmp_path, "export")
    assert "{sft,rl,grpo,tokens}" in export and "--min-reward" in export and "--out" in export
    assert "--screenshots" in help_of(tmp_path, "export-gui")
    assert "SCENARIO" in help_of(tmp_path, "bench")

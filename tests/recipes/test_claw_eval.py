"""Claw-Eval's task folders run unchanged (`--tasks claw-eval:DIR`): eight folders written for these
tests in Claw-Eval's format (tests/recipes/claw_eval/tasks: gmail, calendar (zh), todo, contacts,
kb (sandbox_grader_files + env_snapshot_commands), inventory (a safety check), scheduler, notes (a
user_agent)) load; their oracle.sh scores 1.0 and the empty policy 0.0 on local; a stub claw_eval
package on the path makes the task's grader.py grade; bad folders are one line each."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from orchard_async.apps.cli import main as cli_main
from orchard_async.recipes import claw
from orchard_async.recipes.claw import claw_eval
from orchard_async.recipes.claw.claw_eval import grading as ce_grading
from orchard_async.recipes.claw.claw_eval.loader import inspect_folder
from orchard_async.recipes.claw.grading import GraderFailure
from orchard_async.recipes.claw.sandbox import claw_eval_services, claw_tools
from orchard_async.records.trajectory import TrajectoryWriter
from tests.recipes.swe_support import RunResult, ScriptPolicy, run_rollout

HERE = Path(__file__).parent / "claw_eval"
TASKS = HERE / "tasks"
STUB = HERE / "stub"
SOURCE = f"claw-eval:{TASKS}"


@pytest.fixture(scope="module")
def tasks() -> dict:
    return {t.id: t for t in claw.load_tasks(SOURCE)}


def test_every_task_folder_loads_with_its_services_and_kinds(tasks) -> None:
    assert len(tasks) == 8
    services = {s["name"] for t in tasks.values() for s in t.claw_eval["services"]}
    assert services == {"gmail", "calendar", "todo", "contacts", "kb", "inventory", "scheduler", "notes"}
    assert {t.language for t in tasks.values()} == {"en", "zh"}
    assert any(t.definition.safety_checks for t in tasks.values())
    assert tasks["CE08_notes_user_agent"].has_user and tasks["CE08_notes_user_agent"].world["user"]["max_rounds"] == 2
    kb = tasks["CE05_kb_refund_policy"]
    assert kb.definition.env_snapshot_commands and list(kb.grader_blobs) == ["verify_kb.py"]
    # version 3.0 (a YAML float) and unknown environment keys (mock_today) load; the repo-root path resolves
    gmail = tasks["CE01_gmail_confirm_quote"]
    assert gmail.definition.version == "3.0"
    assert [m["message_id"] for m in gmail.world["claw_eval"]["gmail"]["state"]["messages"]] == ["msg_001", "msg_002"]
    assert [t["name"] for t in gmail.claw_eval["tools"]][:1] == ["gmail.gmail_list_messages"]


def _cheat(tasks) -> dict:
    """Deletes an item the task forbids deleting, after doing the job: the safety gate zeroes it."""
    task = tasks["CE06_inventory_restock"]
    return {task.id: [*task.oracle[:-1], "inventory inventory_delete_item --item_id i3", task.oracle[-1]]}


# Sends a mail, then tries the declared reset endpoint without the controller's MAC and reads the
# service's audit endpoint over HTTP, answering with what it saw.
AUDIT_SENT = "python3 -c 'import json, sys; print(len(json.load(sys.stdin)[\"sent\"]))'"
PROBE = {
    "CE01_gmail_confirm_quote": [
        "gmail gmail_send_message --to a@b.example --subject s --body b",
        "claw answer \"reset=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' "
        "-d '{}' http://localhost:9100/gmail/reset) sent=$(curl -s http://localhost:9100/gmail/audit | "
        + AUDIT_SENT
        + ')"',
    ]
}


@pytest.fixture(scope="module")
def stub_graded() -> Iterator[Any]:
    """CE01 loaded with a stub ``claw_eval`` package on the path (its grader.py then grades), and the
    stub's loader; the path and the stub's modules are gone again after the module."""
    sys.path.insert(0, str(STUB))
    try:
        (task,) = [t for t in claw.load_tasks(SOURCE) if t.id == "CE01_gmail_confirm_quote"]
        lines, _ = claw_eval.validate(TASKS)
        from claw_eval.graders import registry

        yield task, registry, lines
    finally:
        sys.path.remove(str(STUB))
        for name in [m for m in sys.modules if m == "claw_eval" or m.startswith("claw_eval.")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tasks, stub_graded) -> dict[str, RunResult]:
    """Every rollout of this file at once (they mostly wait on commands)."""
    root = tmp_path_factory.mktemp("claw-eval")
    listed = list(tasks.values())
    cheat = _cheat(tasks)
    graded_by_stub = stub_graded[0]
    plans = {
        "oracle": (listed, claw.make_policy("oracle")),
        "empty": (listed, claw.make_policy("empty")),
        "cheat": ([tasks[task_id] for task_id in cheat], ScriptPolicy(cheat, "cheat")),
        "probe": ([tasks["CE01_gmail_confirm_quote"]], ScriptPolicy(PROBE, "probe")),
        "stub-oracle": ([graded_by_stub], claw.make_policy("oracle")),
        "stub-empty": ([graded_by_stub], claw.make_policy("empty")),
    }
    results: dict[str, RunResult] = {}

    async def one(name: str) -> None:
        chosen, policy = plans[name]
        results[name] = await run_rollout(chosen, policy, root / name, concurrency=8)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for name in plans:
                group.start_soon(one, name)

    anyio.run(main)
    return results


def test_oracle_scores_one_and_empty_zero_on_local(runs) -> None:
    oracle, empty = runs["oracle"], runs["empty"]
    assert [(t.task_id, t.reward) for t in oracle.trajectories] == [(t.task_id, 1.0) for t in oracle.trajectories], [
        (t.task_id, t.error, t.info) for t in oracle.trajectories if t.reward != 1.0
    ]
    assert len(oracle.trajectories) == 8 and oracle.leaked == [] and empty.leaked == []
    assert [t.reward for t in empty.trajectories] == [0.0] * 8, [t.error for t in empty.trajectories]
    # the controller's health checks (gmail's is its list endpoint) are not the agent's calls
    assert [t.info["tool_calls"] for t in empty.trajectories] == [0] * 8
    for t in oracle.trajectories:
        info = t.info
        assert info["graded_by"] == ce_grading.GRADED_BY_RECIPE
        assert (info["completion"], info["safety"], info["robustness"]) == (1.0, 1.0, 1.0)


def test_services_answer_their_endpoints_and_audit_what_graders_read(runs) -> None:
    by_id = {t.task_id: t.info for t in runs["oracle"].trajectories}
    gmail = by_id["CE01_gmail_confirm_quote"]
    assert gmail["expected_actions"] == {"gmail.sent": True}
    sends = [e for e in gmail["audit"] if e["tool"] == "gmail.gmail_send_message"]
    assert sends and sends[0]["via"] in ("endpoint", "cli") and sends[0]["response"]["status"] == "sent"
    assert by_id["CE02zh_calendar_team_review"]["expected_actions"] == {"calendar.created_events": True}
    assert by_id["CE07_scheduler_nightly_backup"]["expected_actions"] == {"scheduler.created_jobs": True}
    assert by_id["CE08_notes_user_agent"]["user_agent_rounds"] == 1
    # every interface reaches the task's own tools: endpoint or CLI, function tools (`claw batch`), MCP
    via = {(e["tool"], e["via"]) for info in by_id.values() for e in info["audit"]}
    assert {("todo.todo_list_tasks", "function"), ("scheduler.scheduler_list_jobs", "mcp")} <= via
    assert ("contacts.contacts_search", "cli") in via


def test_the_reset_endpoint_needs_the_controllers_key_and_the_audit_endpoint_serves(runs) -> None:
    (t,) = runs["probe"].trajectories
    answer = [e for e in t.info["audit"] if e["tool"] == "agent.answer"][0]["args"]["text"]
    assert answer == "reset=403 sent=1"
    assert t.info["expected_actions"] == {"gmail.sent": True} and t.info["components"]["replied"] is True


def test_grader_files_arrive_only_after_the_agent_and_snapshot_commands_run(runs) -> None:
    oracle = {t.task_id: t for t in runs["oracle"].trajectories}["CE05_kb_refund_policy"]
    info = oracle.info
    assert info["env_snapshot"]["cmd:python3 verify_kb.py"]["stdout"].strip() == "VERIFIED"
    assert info["env_snapshot"]["file:results/answer.md"]["content"].startswith("Refund window: 30 days")
    answer = [e for e in info["audit"] if e["tool"] == "agent.answer"][0]["args"]["text"]
    assert "verify_kb.py" not in answer  # the oracle lists the grader file into its answer: it was not there
    empty = {t.task_id: t for t in runs["empty"].trajectories}["CE05_kb_refund_policy"]
    assert empty.info["env_snapshot"]["cmd:python3 verify_kb.py"]["exit_code"] == 1


def test_a_safety_violation_zeroes_the_task(runs) -> None:
    (t,) = runs["cheat"].trajectories
    info = t.info
    assert t.reward == 0.0 and info["safety"] == 0.0 and info["completion"] == 1.0
    assert info["safety_violations"] == ["must not delete items"]


def test_with_claw_eval_importable_the_tasks_grader_py_grades(runs, stub_graded) -> None:
    task, registry, lines = stub_graded
    assert task.claw_eval_grades and "graded by its grader.py (claw_eval)" in lines[0], lines[0]
    (t,) = runs["stub-oracle"].trajectories
    assert t.info["graded_by"] == ce_grading.GRADED_BY_CLAW_EVAL
    assert t.info["communication"] == 0.75  # the mark only CE01's grader.py gives
    assert t.reward == 1.0 and (task.id, str(task.task_dir / "grader.py")) in registry.LOADED
    (e,) = runs["stub-empty"].trajectories
    assert e.reward == 0.0 and e.info["graded_by"] == ce_grading.GRADED_BY_CLAW_EVAL
    # loaded without the stub, the same task is graded by its yaml
    assert not [t for t in runs["oracle"].trajectories if t.info["graded_by"] != ce_grading.GRADED_BY_RECIPE]


def test_a_grader_py_that_crashes_is_a_verifier_error_not_zero(stub_graded, tmp_path) -> None:
    task, _, _ = stub_graded
    folder = tmp_path / "tasks" / task.id
    shutil.copytree(task.task_dir, folder)
    (folder / "grader.py").write_text(
        "from claw_eval.graders.base import AbstractGrader\n\n\n"
        "class Broken(AbstractGrader):\n"
        "    def grade(self, messages, dispatches, task, audit_data=None, judge=None):\n"
        "        raise KeyError('sent')\n"
    )
    moved = dataclasses.replace(task, source=folder / "task.yaml", task_dir=folder)
    run = {"messages": [{"role": "user", "text": "hi"}], "dispatches": [], "audit_data": {}}
    with pytest.raises(GraderFailure, match="grader.py failed: KeyError"):
        ce_grading.grade_claw_eval(moved, run, {})


def test_a_check_the_recipe_cannot_grade_is_a_verifier_error_not_zero(tasks) -> None:
    task = tasks["CE04_contacts_phone"]
    definition = ce_grading_definition_with(task, "regex_match")
    original = task.definition
    task.definition = definition
    try:
        with pytest.raises(GraderFailure, match="check type 'regex_match' cannot be graded"):
            anyio.run(ce_grading.grade_recipe, task, {"messages": [], "dispatches": [], "audit_data": {}})
        assert ce_grading.unsupported_checks(definition) == [
            "scoring_components[0] (searched): check type 'regex_match'"
        ]
    finally:
        task.definition = original


def ce_grading_definition_with(task, kind: str):
    from orchard_async.recipes.claw.claw_eval.schema import parse

    data = yaml.safe_load(task.source.read_text())
    data["scoring_components"][0]["check"]["type"] = kind
    return parse(data)


# -- bad folders: one line each, the others run ----------------------------------------------------

BREAKS = {
    "bad_yaml": (lambda text, data: "task_id: [unclosed\n", "task.yaml is not valid YAML"),
    "bad_service": (
        lambda text, data: yaml.safe_dump({**data, "services": [{**data["services"][0], "name": "web_real"}]}),
        "service 'web_real' is not one we have",
    ),
    "bad_fixture": (
        lambda text, data: yaml.safe_dump(
            {**data, "services": [{**data["services"][0], "env": {"TODO_FIXTURES": "fixtures/todo/missing.json"}}]}
        ),
        "file 'fixtures/todo/missing.json' not found",
    ),
    "bad_check_key": (
        lambda text, data: yaml.safe_dump(
            {
                **data,
                "scoring_components": [
                    {**data["scoring_components"][0], "check": {**data["scoring_components"][0]["check"], "tool": "x"}}
                ],
            }
        ),
        "Object contains unknown field `tool` - at `$.scoring_components[0].check`",
    ),
}


@pytest.fixture
def mixed_folder(tmp_path) -> Path:
    folder = tmp_path / "tasks"
    good = TASKS / "CE03_todo_close_done"
    shutil.copytree(good, folder / good.name)
    text = (good / "task.yaml").read_text()
    for name, (change, _) in BREAKS.items():
        shutil.copytree(good, folder / name)
        data = yaml.safe_load(text)
        data["task_id"] = name
        (folder / name / "task.yaml").write_text(change(text, data))
    return folder


def test_bad_folders_are_one_clear_line_each_and_the_others_load(mixed_folder, capsys) -> None:
    tasks, problems = inspect_folder(mixed_folder, image="orchard/python:test")
    assert [t.id for t in tasks] == ["CE03_todo_close_done"]
    lines = {p.name: p.line() for p in problems}
    assert sorted(lines) == sorted(BREAKS)
    for name, (_, expected) in BREAKS.items():
        assert expected in lines[name] and "\n" not in lines[name], lines[name]
    loaded = claw.load_tasks(f"claw-eval:{mixed_folder}")
    assert [t.id for t in loaded] == ["CE03_todo_close_done"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith("claw-eval: bad_") for line in err)


def test_claw_validate_prints_per_task_and_exits_1_when_some_cannot_run(mixed_folder, capsys) -> None:
    assert cli_main(["claw", "validate", str(mixed_folder)]) == 1
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert len(lines) == 5 and "Traceback" not in out.out + out.err
    assert lines[0].startswith("CE03_todo_close_done: loads, runs: services todo, 2 tools")
    assert sum(": cannot run: " in line for line in lines) == 4


def test_claw_report_gives_per_task_dimensions_and_pass_at_k(runs, tmp_path, capsys) -> None:
    writer = TrajectoryWriter(tmp_path / "run.jsonl")
    for trajectory in runs["oracle"].trajectories + runs["empty"].trajectories + runs["cheat"].trajectories:
        writer.write(trajectory)
    writer.close()
    assert cli_main(["claw", "report", str(tmp_path / "run.jsonl"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(rows) == sorted(t.task_id for t in runs["oracle"].trajectories)
    row = rows["CE06_inventory_restock"]  # oracle, empty, and the cheat that deleted an item
    assert row["trials"] == 3 and row["passed"] == 1 and row["safety"] == round(2 / 3, 4)
    assert row["completion"] == round(2 / 3, 4) and row["pass@1"] == round(1 / 3, 4)
    assert row["pass@3"] == 1.0 and row["pass^3"] == 0.0
    assert rows["CE01_gmail_confirm_quote"]["pass^2"] == 0.0 and rows["CE01_gmail_confirm_quote"]["pass@2"] == 1.0
    assert cli_main(["claw", "report", str(tmp_path / "run.jsonl")]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:6] == ["task", "trials", "completion", "safety", "robustness", "score"]
    assert len(table) == 9


# -- the services' rules, without a sandbox ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "verb"),
    [
        ("/gmail/messages", "list"),
        ("/gmail/messages/get", "get"),
        ("/gmail/send", "send"),
        ("/gmail/drafts/save", "draft"),
        ("/calendar/events/create", "create"),
        ("/todo/tasks/complete", "update"),
        ("/inventory/items/delete", "delete"),
        ("/kb/search", "list"),
        ("/notes/create", "create"),
        ("/scheduler/jobs/cancel", "delete"),
    ],
)
def test_an_endpoints_path_says_what_it_does(path, verb) -> None:
    assert claw_eval_services.verb(path) == verb


def test_records_change_and_every_call_is_in_the_services_audit() -> None:
    world = {
        "claw_eval": claw_eval_services.seed([{"name": "todo", "fixtures": [[{"task_id": "t1", "status": "open"}]]}])
    }
    changes = claw_tools.Changes()
    created = claw_eval_services.call(world, "todo", "/todo/tasks/create", "POST", {"title": "Call Lee"}, changes)
    assert created["task_id"] == "task_002"
    claw_eval_services.call(world, "todo", "/todo/tasks/complete", "POST", {"task_id": "t1"}, changes)
    with pytest.raises(claw_tools.ToolError, match="no task with task_id='t9'"):
        claw_eval_services.call(world, "todo", "/todo/tasks/get", "POST", {"task_id": "t9"}, changes)
    listed = claw_eval_services.call(world, "todo", "/todo/tasks", "POST", {"status": "completed"}, changes)
    assert [t["task_id"] for t in listed["tasks"]] == ["t1"]
    audit = world["claw_eval"]["todo"]["audit"]
    assert [(c["endpoint"], c["status"]) for c in audit["calls"]] == [
        ("/todo/tasks/create", 200),
        ("/todo/tasks/complete", 200),
        ("/todo/tasks/get", 404),
        ("/todo/tasks", 200),
    ]
    assert (
        audit["created_tasks"][0]["title"] == "Call Lee" and audit["updated_tasks"][0]["after"]["status"] == "completed"
    )

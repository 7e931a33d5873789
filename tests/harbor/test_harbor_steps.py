"""Multi-step tasks as Harbor's trial runs them, on the local adapter: the agent once per step
with that step's instruction, the step verified as it ends (its reward in the trajectory),
``min_reward`` stopping the later steps, a step's turns bounding it, a separate verifier
grading each step with the artifacts it ended with, and a step never reached counting 0."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
from pathlib import Path

import orchard_async as oa
from orchard_async.recipes import harbor
from orchard_async.recipes.harbor.task import LIST_PROCESSES
from tests.harbor.support import TASKS, ScriptPolicy, load, run_sync


class Forever:
    """Never submits: each step ends when its turns run out."""

    name = "forever"

    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []
        self.ended: list[str] = []

    async def act(self, observation: oa.Observation) -> oa.Action:
        self.seen.append((observation.step, observation.instruction.split()[0]))
        return oa.Action(command="true")

    def episode_ended(self, episode_id: str) -> None:
        self.ended.append(episode_id)


def test_a_step_ends_when_its_turns_run_out_and_min_reward_stops_the_rest() -> None:
    forever = Forever()
    found = run_sync(load(ids=["multi-step"], max_steps=3), harbor.Stepwise(forever), "local")
    t = found["multi-step"]
    assert (t.end_reason, t.reward) == ("submitted", 0.0), t.error
    assert t.info["steps"] == {"create": {"reward": 0.0}}
    assert forever.seen == [(0, "Create"), (1, "Create")]  # two turns, then the step's end took the third
    end = json.loads(t.steps[2].action.raw)
    assert t.steps[2].action.kind == "submit" and (end["ended"], end["stopped"]) == ("out of turns", True)
    assert forever.ended == [t.episode_id]  # the wrapper passes the episode's end on to the policy it wraps


def test_a_step_never_reached_counts_zero() -> None:
    # a policy of its own, not run step by step: it only ever sees the first step
    tasks = load(ids=["multi-step"])
    found = run_sync(tasks, ScriptPolicy(["echo one > /app/list.txt"]), "local")
    t = found["multi-step"]
    assert t.info["steps"] == {"create": {"reward": 1.0}, "extend": None}
    assert t.reward == 0.5 and "not reached" in t.info["errors"]["extend"]
    gc.collect()
    assert tasks[0]._states == {}, "what the task kept of a sandbox goes with the sandbox"


def separate_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "multi-separate"
    shutil.copytree(TASKS / "multi-step", folder)
    text = (folder / "task.toml").read_text()
    text = text.replace('multi_step_reward_strategy = "mean"\n', 'multi_step_reward_strategy = "mean"\n'
                        'artifacts = ["/app/list.txt", "/app/seed.txt", "/app/seed-copy.txt"]\n')  # fmt: skip
    text = text.replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
    (folder / "task.toml").write_text(text)
    return folder


def test_a_separate_verifier_grades_each_step_with_the_artifacts_it_ended_with(tmp_path) -> None:
    folder = separate_copy(tmp_path)
    tasks = load(folder)
    assert isinstance(tasks[0], harbor.SeparateHarborTask)
    oracle = run_sync(tasks, harbor.make_policy("oracle"), "local")["multi-separate"]
    assert (oracle.reward, oracle.end_reason) == (1.0, "submitted"), (oracle.error, oracle.info)
    assert oracle.info["steps"] == {"create": {"reward": 1.0}, "extend": {"reward": 1.0}}
    assert json.loads(oracle.steps[1].action.raw)["verified"] == "at the end (separate verifier)"
    # each step is graded on the artifacts it ended with: step create's list, before step
    # extend replaced it (graded on the final state, create would fail and stop the rest)
    found = run_sync(load(folder), harbor.Stepwise(ByStep()), "local")["multi-separate"]
    assert "steps" in found.info, (found.end_reason, found.error)
    assert found.info["steps"] == {"create": {"reward": 1.0}, "extend": {"reward": 0.0}}, found.info
    assert found.reward == 0.5


class ByStep:
    """Writes the list right for step create, then replaces it with a wrong one in step extend."""

    name = "by-step"

    async def act(self, observation: oa.Observation) -> oa.Action:
        if observation.step:
            return oa.Action(kind="submit", command="submit")
        text = "one" if observation.instruction.startswith("Create") else "two"
        return oa.Action(command=observation.task.agent_command(f"echo {text} > /app/list.txt"))


def test_the_process_listing_succeeds_when_a_listed_process_is_gone_by_its_read() -> None:
    """What a step's end records as the sandbox's own processes: a process that ended between
    the listing's glob and its read (here the last one, a pid that cannot exist) is left out,
    and the listing still succeeds (it failed the step's end, and the episode, under load)."""
    script = LIST_PROCESSES.replace("/proc/[0-9]*", "/proc/[0-9]* /proc/999999999")
    assert script != LIST_PROCESSES
    listed = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30, check=False)
    assert listed.returncode == 0, listed.stderr
    started = open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[19]  # field 22
    assert f"{os.getpid()}:{started}" in listed.stdout.split()
    assert not any(line.startswith("999999999:") for line in listed.stdout.split())

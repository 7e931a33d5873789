"""Scripted policies for the Harbor recipe: ``oracle`` (the task's ``solution/solve.sh``, as
Harbor's oracle agent runs it) and ``empty`` (does nothing)."""

from __future__ import annotations

import base64
import io
import tarfile
from pathlib import Path

from orchard_async import Action, Observation
from orchard_async.recipes.harbor import config as cfg
from orchard_async.recipes.harbor.task import HarborTask, emptied


def _tar_of(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    return buffer.getvalue()


def solve_command(task: HarborTask, index: int) -> str:
    """Put solution ``index`` at /solution (as root, where commands run as root), then run
    its ``solve.sh`` as the agent user in the workdir with ``[solution].env``."""
    folder, env = task.solutions()[index]
    packed = base64.b64encode(_tar_of(folder)).decode()
    stage = (
        f"{emptied(cfg.SOLUTION)} && echo {packed} | base64 -d | tar xzf - -C {cfg.SOLUTION} "
        f"--no-same-owner && chmod -R a+rX {cfg.SOLUTION} && chmod +x {cfg.SOLUTION}/solve.sh"
    )
    run = task.as_user(f"{cfg.SOLUTION}/solve.sh", task.agent_user, agent=True, env=cfg.resolve_env(env))
    return f"{stage} && {run}"


class OraclePolicy:
    """Runs the task's solution (of the step the episode is on: ``steps.Stepwise`` runs it
    once per step), then submits."""

    name = "oracle"

    async def act(self, observation: Observation) -> Action:
        task = observation.task
        if not isinstance(task, HarborTask):
            raise TypeError("the harbor oracle needs Harbor tasks (with a solution/ folder)")
        if observation.step == 0:
            index = task.step_of(observation.episode_id)
            command = solve_command(task, index)
            return Action(command=command, raw=f"I run solution {index + 1}.\n\n```bash\n{command}\n```")
        return Action(kind="submit", command="submit", raw="The task is done.\n\n```bash\nsubmit\n```")


class EmptyPolicy:
    """Submits at once: every task must score 0."""

    name = "empty"

    async def act(self, observation: Observation) -> Action:
        return Action(kind="submit", command="submit", raw="I submit without doing anything.\n\n```bash\nsubmit\n```")

"""Scripted policies for the Claw recipe: ``oracle`` (each task's scripted solution) and
``empty`` (gives up at once: every task must score 0)."""

from __future__ import annotations

from orchard_async import Action, Observation


class OraclePolicy:
    """Runs the task's ``oracle`` commands (CLI calls, retried where the task injects
    faults), then submits."""

    name = "oracle"

    async def act(self, observation: Observation) -> Action:
        script = getattr(observation.task, "oracle", None)
        if script is None:
            raise TypeError("the claw oracle needs Claw tasks (with an oracle script)")
        if observation.step < len(script):
            return Action(command=script[observation.step])
        return Action(kind="submit")


class EmptyPolicy:
    """Submits at once, doing nothing."""

    name = "empty"

    async def act(self, observation: Observation) -> Action:
        return Action(kind="submit")

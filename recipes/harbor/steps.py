"""Multi-step Harbor tasks as Harbor's trial runs them: the agent once per step, each time with
that step's instruction, and that step's verifier after it (``HarborTask.end_step``).

The engine runs one agent phase per episode, so the steps are driven from the policy's side:
``Stepwise`` wraps a policy (every policy of ``make_policy`` is wrapped) and shows it one step
at a time: the step's instruction, its turns counted from 0, only its own history, and the
time left of the step's ``[steps.agent].timeout_sec``. When the wrapped policy submits, or
the step's turns (``max_steps``) or time run out, the step ends: a later step remains, so the
task verifies this one and stages the next, and the episode's trajectory gets one step for the
boundary (a no-op command; its ``raw`` the step's rewards as JSON, and what the policy's own
last action said). A step below its ``min_reward`` (or without a verdict) ends the episode,
as Harbor stops there. The last step's end is the episode's submit; ``evaluate`` verifies it.

A one-step task passes straight through to the wrapped policy.
"""

from __future__ import annotations

import json
import time

from orchard_async import Action, Observation, Policy
from orchard_async.protocols import tell_episode_ended
from orchard_async.recipes.harbor.task import HarborTask

AGENT_NOTE_CHARS = 2000  # of the wrapped policy's last action kept in a step's boundary


class Stepwise:
    """Runs ``policy`` once per step of a multi-step Harbor task."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.name = policy.name

    async def act(self, observation: Observation) -> Action:
        task = observation.task
        if not isinstance(task, HarborTask) or len(task.config.steps) < 2:
            return await self.policy.act(observation)
        state = task.state(task.sandbox_of(observation.episode_id))
        index = state.step
        turn = observation.step - state.step_offset
        left = task.step_timeout(index) - (time.monotonic() - state.step_started)
        action: Action | None = None
        if turn < task.step_turns - 1 and left > 0:  # the step's last turn is its end
            step_view = Observation(
                observation.episode_id,
                task,
                task.step_instruction(index),
                turn,
                observation.history[state.step_offset :],
                max(0.0, min(observation.remaining, left)),
            )
            action = await self.policy.act(step_view)
            if action.kind != "submit":
                return action
        ended = "submitted" if action is not None else ("out of time" if left <= 0 else "out of turns")
        if index == len(task.config.steps) - 1:
            return action or Action(kind="submit", command="submit", raw=f"The last step ended: {ended}.")
        report = await task.end_step(observation.episode_id)
        report["ended"] = ended
        if action is not None and action.raw:
            report["agent"] = action.raw[-AGENT_NOTE_CHARS:]
        state.step_offset = observation.step + 1
        raw = json.dumps(report)
        if report["stopped"]:
            return Action(kind="submit", command="submit", raw=raw)
        return Action(command=f": step {report['step']} ended, step {report['next']} begins", raw=raw)

    def episode_ended(self, episode_id: str) -> None:
        tell_episode_ended(self.policy, episode_id)

    async def close(self) -> None:
        close = getattr(self.policy, "close", None)
        if close is not None:
            await close()

"""A synthetic task and policy for the scale and chaos scenarios: exactly ``steps``
commands per episode, a trivial verifier, so the numbers are the engine's and the
backend's, not a recipe's."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchard_async import Action, Observation, Reward, Sandbox, SandboxSpec


@dataclass
class StepsTask:
    id: str
    steps: int = 20
    command: str = "true"
    spec: SandboxSpec = field(default_factory=SandboxSpec)
    deadline: float = 600.0
    score_timeout: float = 10.0
    exec_timeout: float = 30.0

    @property
    def max_steps(self) -> int:
        return self.steps

    async def setup(self, sandbox: Sandbox) -> str:
        return f"run {self.command!r} {self.steps} times"

    async def evaluate(self, sandbox: Sandbox) -> Reward:
        return Reward(value=1.0, success=True)


class RepeatPolicy:
    """Sends the task's command at every step (never submits: the episode ends at max_steps)."""

    name = "repeat"

    def __init__(self) -> None:
        self._actions: dict[str, Action] = {}

    async def act(self, observation: Observation) -> Action:
        command = getattr(observation.task, "command", "true")
        action = self._actions.get(command)
        if action is None:
            action = self._actions[command] = Action(command=command)
        return action


def steps_tasks(count: int = 8, **options: object) -> list[StepsTask]:
    return [StepsTask(id=f"steps-{index}", **options) for index in range(count)]  # type: ignore[arg-type]

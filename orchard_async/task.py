"""Tasks say what an episode is about; policies decide what to do in it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgspec

from .protocols import Sandbox
from .trajectory import Action, Step
from .types import SandboxSpec


class Reward(msgspec.Struct, kw_only=True):
    value: float
    success: bool
    info: dict[str, Any] = {}


@runtime_checkable
class Task(Protocol):
    """One problem. ``deadline`` bounds the whole episode; ``score_timeout`` of it is kept
    for scoring, so the sandbox never dies before its verifier runs.

    A task scores in one of two ways: ``evaluate(sandbox)`` judges the agent's own sandbox
    (fine for toy chores), or, as ``GradedApart``, ``submission`` + ``grade`` judge the
    agent's output in a clean sandbox (what any reward a policy could learn to forge needs).
    """

    id: str
    spec: SandboxSpec
    max_steps: int
    deadline: float
    score_timeout: float
    exec_timeout: float

    async def setup(self, sandbox: Sandbox) -> str:
        """Prepare the sandbox; return the instruction the agent sees."""
        ...

    async def evaluate(self, sandbox: Sandbox) -> Reward:
        """The verdict on the agent's sandbox as it was left (not called for GradedApart tasks)."""
        ...


@runtime_checkable
class GradedApart(Protocol):
    """A task whose verdict the agent cannot touch. ``submission`` reads what the agent
    produced out of its sandbox (a patch, an answer): the only thing that crosses over.
    The agent's sandbox is then destroyed, with whatever it left running, and ``grade``
    judges the submission in a fresh sandbox of the same spec. The episode loop prefers
    this over ``evaluate`` whenever a task has both."""

    async def submission(self, sandbox: Sandbox) -> str: ...

    async def grade(self, submission: str, sandbox: Sandbox) -> Reward: ...


@dataclass(slots=True)
class Observation:
    """What a policy sees before each action. ``history`` is the episode so far."""

    episode_id: str
    task: Task
    instruction: str
    step: int
    history: list[Step] = field(default_factory=list)
    remaining: float = 0.0  # seconds left for the agent before scoring


@runtime_checkable
class Policy(Protocol):
    name: str

    async def act(self, observation: Observation) -> Action: ...

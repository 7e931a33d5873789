"""What a task returns and what a policy sees: ``Reward`` and ``Observation``.

The ``Task``, ``GradedApart`` and ``Policy`` protocols are part of the contract in
``protocols``; they are re-exported here for code that imports them from this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from orchard_async.protocols import GradedApart, Policy, Task

if TYPE_CHECKING:  # a record type: the contract does not import the records layer when it runs
    from orchard_async.records.trajectory import Step

__all__ = ["GradedApart", "Observation", "Policy", "Reward", "Task"]


class Reward(msgspec.Struct, kw_only=True):
    value: float
    success: bool
    info: dict[str, Any] = {}


@dataclass(slots=True)
class Observation:
    """What a policy sees before each action. ``history`` is the episode so far."""

    episode_id: str
    task: Task
    instruction: str
    step: int
    history: list[Step] = field(default_factory=list)
    remaining: float = 0.0  # seconds left for the agent before scoring

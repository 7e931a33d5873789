"""What a task returns and what a policy sees: ``Reward`` and ``Observation``.

The ``Task``, ``GradedApart`` and ``Policy`` protocols that use them are in ``protocols``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:  # annotations only: protocols names these types, and Step is a record
    from orchard_async.protocols import Task
    from orchard_async.records.trajectory import Step

__all__ = ["Observation", "Reward"]


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

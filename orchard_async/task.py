"""What a task returns and what a policy sees: ``Reward`` and ``Observation``; what it may
declare of its sandbox's network per phase: ``PhaseNetworks``.

The ``Task``, ``GradedApart`` and ``Policy`` protocols that use them are in ``protocols``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from orchard_async.capabilities import NetworkPolicy, spec_network
from orchard_async.errors import ConfigError

if TYPE_CHECKING:  # annotations only: protocols names these types, and Step is a record
    from orchard_async.protocols import Task
    from orchard_async.records.trajectory import Step

__all__ = ["Observation", "PhaseNetworks", "Reward", "phase_network"]


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


class PhaseNetworks(msgspec.Struct, frozen=True, kw_only=True):
    """A task's network per phase: ``setup`` (its ``setup``), ``agent`` (the policy's turns) and
    ``scoring`` (``evaluate``, or ``grade`` in the scorer's sandbox). A phase left at None has
    the network the task's ``spec`` asks for. A task declares it as an optional attribute,
    ``network``; the engine switches the sandbox between phases (``set_network``) and refuses
    the episode on an adapter that cannot (``capabilities.NetworkControl``). The usual shape,
    an environment installed online and then worked on and judged offline::

        network = PhaseNetworks(setup=ONLINE, agent=OFFLINE, scoring=OFFLINE)
    """

    setup: NetworkPolicy | None = None
    agent: NetworkPolicy | None = None
    scoring: NetworkPolicy | None = None


def phase_network(task: Task, phase: str) -> NetworkPolicy | None:
    """The network ``task`` declares for ``phase`` (None: it declares none at all, so the
    engine leaves the sandbox's network alone; an undeclared phase of a task that declares
    others has its spec's network)."""
    declared = getattr(task, "network", None)
    if declared is None:
        return None
    if not isinstance(declared, PhaseNetworks):
        raise ConfigError(f"task {task.id}: network must be a PhaseNetworks, not {type(declared).__name__}")
    return getattr(declared, phase) or spec_network(task.spec.network)

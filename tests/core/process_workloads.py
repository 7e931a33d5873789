"""Builds for ``ProcessRollout`` tests (``tests.core.process_workloads:NAME``): each runs in a
worker process and returns a ``Workload``; its report says what that worker ran."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import orchard_async as oa
from orchard_async.engine.processes import this_worker


@dataclass
class EchoTask:
    id: str
    steps: int = 3
    spec: oa.SandboxSpec = field(default_factory=oa.SandboxSpec)
    max_steps: int = 20
    deadline: float = 60.0
    score_timeout: float = 5.0
    exec_timeout: float = 5.0

    async def setup(self, sandbox: oa.Sandbox) -> str:
        return f"echo {self.steps} times"

    async def evaluate(self, sandbox: oa.Sandbox) -> oa.Reward:
        return oa.Reward(value=1.0, success=True)


class EchoPolicy:
    """Echoes the step, then submits; remembers the episodes it acted in. With ``die_after``, the
    worker process exits abruptly once that many of its episodes ended."""

    name = "echo"

    def __init__(self, die_after: int | None = None, slow: float = 0.0):
        self.episodes: set[str] = set()
        self.ended = 0
        self.die_after = die_after
        self.slow = slow

    async def act(self, observation: oa.Observation) -> oa.Action:
        self.episodes.add(observation.episode_id)
        if self.slow:
            import anyio

            await anyio.sleep(self.slow)
        if observation.step < observation.task.steps:  # type: ignore[attr-defined]
            return oa.Action(command=f"echo {observation.step}")
        return oa.Action(kind="submit")

    def episode_ended(self, episode_id: str) -> None:
        self.ended += 1
        if self.die_after is not None and self.ended >= self.die_after:
            os._exit(9)  # a worker killed mid-run: no goodbye


def echo(tasks: int = 6, die_after: int | None = None, die_in: int | None = None, slow: float = 0.0) -> oa.Workload:
    """``tasks`` echo tasks on sim; with ``die_after``, the worker of index ``die_in`` dies."""
    worker = this_worker()
    dies = die_after is not None and worker is not None and worker[0] == die_in
    policy = EchoPolicy(die_after if dies else None, slow)
    work = [EchoTask(f"echo-{index}") for index in range(tasks)]
    return oa.Workload(
        work,
        policy,
        oa.get_adapter("sim"),
        report=lambda: {"pid": os.getpid(), "worker": this_worker(), "episodes": sorted(policy.episodes)},
    )


def broken() -> oa.Workload:
    raise ValueError("no such model server")

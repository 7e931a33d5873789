"""A task and an adapter for the trainer adapters' tests (on the local adapter)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orchard_async as oa
from orchard_async.errors import CreateFailed
from orchard_async.kit import labels


@dataclass(eq=False)
class EchoTask:
    """Each reply is written to the sandbox (``reply_command``); the reward is the length of
    the last one modulo 7, over 6: random replies of a random model get different rewards,
    so a GRPO group has something to learn from."""

    id: str = "echo"
    spec: oa.SandboxSpec = field(default_factory=oa.SandboxSpec)
    max_steps: int = 2
    deadline: float = 120.0
    score_timeout: float = 20.0
    exec_timeout: float = 20.0
    fork_after_setup: bool = False

    async def setup(self, sandbox: oa.Sandbox) -> str:
        return "Say something."

    async def evaluate(self, sandbox: oa.Sandbox) -> oa.Reward:
        size = int((await sandbox.read_file("size")).decode() or 0)
        return oa.Reward(value=(size % 7) / 6, success=size % 7 == 6)


def reply_command(text: str) -> oa.Action:
    return oa.Action(command=f"printf %s {len(text)} > size", raw=text)


def chat_of(trajectory: oa.Trajectory) -> list[dict[str, Any]]:
    """The chat a model sees: the instruction, then its replies and what each left."""
    messages = [{"role": "user", "content": trajectory.instruction}]
    for step in trajectory.steps:
        messages.append({"role": "assistant", "content": step.action.raw})
        messages.append({"role": "user", "content": step.observation or "ok"})
    return messages


class FailingCreates:
    """The adapter, but the sandbox of the first episode whose id ends with ``doomed`` cannot
    be made (``times`` times)."""

    def __init__(self, inner: Any, doomed: str, times: int = 1):
        self.inner = inner
        self.name = inner.name
        self.doomed = labels.episode_label(doomed)
        self.times = times

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def create(self, spec: oa.SandboxSpec) -> Any:
        if self.times and spec.labels.get(labels.EPISODE, "").endswith(self.doomed):
            self.times -= 1
            raise CreateFailed("injected: the backend refused this sandbox")
        return await self.inner.create(spec)


def task_of_row(**row: Any) -> EchoTask:
    """A dataset row (verl's kwargs, skyrl-gym's extras) -> its task."""
    extra = row.get("extra_info") or {}
    return EchoTask(str(extra.get("task", "echo")))

"""The Harbor recipe's ``harness`` policy: a CLI agent runs inside the task's sandbox, as the
Claw recipe's harness mode runs one (the shared run: ``orchard_async.models.harness``): the
instruction on stdin, its model calls through the controller's recording proxy (relayed onto
the sandbox's loopback: the task's network stays as the task says), one trajectory step per
recorded call, then the submit with the harness's exit status and output. The harness runs as
the task's agent user in its workdir (``task.as_user``), once per step of a multi-step task
(``steps.Stepwise``), with the step's turns (``max_steps - 1`` calls) and time.

The ``harness`` option names it: ``bundled`` (``sandbox/terminal_harness.py`` and the
``harness_chat`` it imports, stdlib only: the image needs python3, which the relay needs
anyway), ``mini-swe-agent`` (the third-party agent from PyPI, which the image must have: map
the task's base to an image with it, e.g.
``{"image_map": {"ubuntu:24.04": "orchard/claw-mini-swe-agent:bookworm"}}``), or a command in
the image that reads the instruction from stdin and calls ``$OPENAI_BASE_URL``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchard_async import Observation, Sandbox
from orchard_async.models.client import ModelConfig
from orchard_async.models.harness import SandboxHarness, bundled_harness, mini_swe_agent_command
from orchard_async.models.proxy import Upstream
from orchard_async.recipes.harbor.task import HarborOptions, HarborTask

HOME = "/tmp/.orchard-harbor-harness"  # the harness's files in the sandbox, readable by the agent user
PRESETS: dict[str, tuple[str, dict[str, Path]]] = {
    "bundled": bundled_harness(f"{HOME}/harness.py", Path(__file__).parent / "sandbox" / "terminal_harness.py"),
    "mini-swe-agent": (mini_swe_agent_command(HOME), {}),
}


class HarnessPolicy(SandboxHarness):
    """Runs an agent harness in a Harbor task's sandbox; its model calls become the steps."""

    def __init__(self, config: ModelConfig, *, harness: str = "bundled", upstream: Upstream | None = None):
        command, files = PRESETS.get(harness, (harness, {}))
        name = f"harness:{harness if harness in PRESETS else harness.split()[0]}:{config.model}"
        super().__init__(config, command=command, files=files, name=name, upstream=upstream)

    @classmethod
    def from_options(cls, options: HarborOptions, config: ModelConfig) -> HarnessPolicy:
        return cls(config, harness=options.harness)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> HarnessPolicy:
        return cls.from_options(HarborOptions(), ModelConfig.from_env(environ, **overrides))

    def _task(self, observation: Observation) -> HarborTask:
        if not isinstance(observation.task, HarborTask):
            raise TypeError("the harbor harness policy needs Harbor tasks")
        return observation.task

    def sandbox_for(self, observation: Observation) -> Sandbox:
        return self._task(observation).sandbox_of(observation.episode_id)

    def max_calls(self, observation: Observation) -> int:
        return max(1, self._task(observation).step_turns - 1)

    def harness_env(self, observation: Observation, max_calls: int) -> dict[str, str]:
        task = self._task(observation)
        return {"HARBOR_MAX_TURNS": str(max_calls), "HARBOR_COMMAND_TIMEOUT": str(task.exec_timeout)}

    def command_for(self, observation: Observation, command: str, env: Mapping[str, str]) -> str:
        # The variables are set inside the command: `su` to the agent user may not pass them on.
        task = self._task(observation)
        return task.as_user(command, task.agent_user, agent=True, env=env)

"""Harness mode for Claw: a real agent harness runs inside the sandbox, and every model call it
makes goes through the controller's recording proxy (``orchard_async.models.proxy``); the run
itself is the shared ``orchard_async.models.harness.SandboxHarness``, this module its Claw side
(the presets, the sandbox the task hands over, ``CLAW_MAX_TURNS``).

The policy's first step runs the harness command in the agent's sandbox with the task's
instruction on stdin and ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL`` pointing
at the proxy as the sandbox sees it (a relay on the sandbox's loopback, carried over one
stream: the sandbox's network stays off). The key is the episode's own; the upstream's real
key never enters the sandbox. The proxy grants ``max_steps - 1`` calls.

The trajectory then gets one step per recorded call, in order: the step's ``action.raw`` is
the ``ModelCall`` as JSON (request messages and tools, the response, usage, latency,
status), its ``usage`` the call's tokens, its command a no-op naming the call. With
``tokens=True`` (the recipe's ``harness_tokens`` option) the proxy asks the backend for token
ids and logprobs, and each call's step also carries its ``TurnTokens`` (``action.tokens``,
from ``stitch_calls``: calls that extend each other are one segment), which
``orchard-async export tokens`` reads. The last step
submits, its ``raw`` the harness's exit status and the tail of its output. Grading is the
task's own (the services' audit and state), as for every other policy.

The default harness is ``sandbox/claw_harness.py`` (stdlib only), copied into the sandbox with
the model client and loop it imports (``bundled_harness``).
The recipe's ``harness`` option (``ClawOptions``; its default from ``ORCHARD_CLAW_HARNESS``), or
``command=``, names a preset (``mini-swe-agent``: the third-party
agent from PyPI, baked into ``MINI_SWE_AGENT_IMAGE``) or is a command that runs another
harness already in the image, reading its task from stdin.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchard_async import Observation, Sandbox, episode_label
from orchard_async.images import ImageSpec
from orchard_async.models.client import ModelConfig
from orchard_async.models.harness import HarnessRun, SandboxHarness, bundled_harness, mini_swe_agent_command
from orchard_async.models.proxy import Upstream
from orchard_async.recipes.claw.task import ClawOptions

SOURCES = Path(__file__).parent / "sandbox"
HARNESS_SOURCE = SOURCES / "claw_harness.py"
HARNESS_PATH = "/tmp/claw/harness.py"
MINI_SWE_AGENT_VERSION = "2.4.6"
# mini-swe-agent (pip) in a sandbox image, built here: `orchard-async images build orchard/claw-mini-swe-agent:bookworm`
MINI_SWE_AGENT_IMAGE = ImageSpec(
    tag="orchard/claw-mini-swe-agent:bookworm",
    base="debian-minbase",
    apt_packages=("python3", "python3-pip"),
    pip_packages=(f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}",),
    check="mini --help >/dev/null && python3 -c 'import minisweagent, litellm'",
)
MINI_SWE_AGENT_COMMAND = mini_swe_agent_command("/tmp/claw", "/tmp/claw/mini_claw.yaml")
# preset name -> (command, files copied into the sandbox first)
PRESETS: dict[str, tuple[str, dict[str, Path]]] = {
    "bundled": bundled_harness(HARNESS_PATH, HARNESS_SOURCE),
    "mini-swe-agent": (MINI_SWE_AGENT_COMMAND, {"/tmp/claw/mini_claw.yaml": SOURCES / "mini_claw.yaml"}),
}
HARNESS_SETTINGS = "CLAW_HARNESS_"  # the prefix of the harness's own variables, passed through to it

__all__ = ["MINI_SWE_AGENT_COMMAND", "MINI_SWE_AGENT_IMAGE", "PRESETS", "HarnessPolicy", "HarnessRun"]


class HarnessPolicy(SandboxHarness):
    """Runs an agent harness in a Claw task's sandbox; its model calls become the episode's steps."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        command: str | None = None,
        upstream: Upstream | None = None,
        env: Mapping[str, str] | None = None,
        tokens: bool = False,
    ):
        preset = command or "bundled"
        shell, files = PRESETS.get(preset, (preset, {}))
        name = f"harness:{preset if preset in PRESETS else preset.split()[0]}:{config.model}"
        super().__init__(config, command=shell, files=files, name=name, upstream=upstream, env=env, tokens=tokens)

    @classmethod
    def from_options(
        cls, options: ClawOptions, config: ModelConfig, environ: Mapping[str, str] | None = None
    ) -> HarnessPolicy:
        """The harness the ``harness`` option names, with the model of ``config``; the harness's
        own settings (``CLAW_HARNESS_*`` variables of ``environ``) are passed to it as they are."""
        env = os.environ if environ is None else environ
        passed = {k: v for k, v in env.items() if k.startswith(HARNESS_SETTINGS)}
        return cls(config, command=options.harness, env=passed, tokens=options.harness_tokens)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> HarnessPolicy:
        """The model's settings and the recipe's options, both from ``environ`` (default: this process's)."""
        return cls.from_options(ClawOptions.from_env(environ), ModelConfig.from_env(environ, **overrides), environ)

    def sandbox_for(self, observation: Observation) -> Sandbox:
        sandboxes = getattr(observation.task, "sandboxes", None)
        sandbox = sandboxes.pop(episode_label(observation.episode_id), None) if sandboxes is not None else None
        if sandbox is None:
            raise TypeError("harness mode needs Claw tasks (their setup hands the policy the agent's sandbox)")
        return sandbox

    def harness_env(self, observation: Observation, max_calls: int) -> dict[str, str]:
        return {"CLAW_MAX_TURNS": str(max_calls)}

"""Harness mode: a real agent harness runs inside the sandbox, and every model call it makes
goes through the controller's recording proxy (``orchard_async.models.proxy``).

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

The default harness is ``sandbox/claw_harness.py`` (stdlib only), copied into the sandbox.
The recipe's ``harness`` option (``ClawOptions``; its default from ``ORCHARD_CLAW_HARNESS``), or
``command=``, names a preset (``mini-swe-agent``: the third-party
agent from PyPI, baked into ``MINI_SWE_AGENT_IMAGE``) or is a command that runs another
harness already in the image, reading its task from stdin.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec

from orchard_async import Action, ModelUnavailable, Observation, episode_label
from orchard_async.images import ImageSpec
from orchard_async.models.client import ModelConfig
from orchard_async.models.proxy import ModelCall, ModelProxy, Upstream, serve_into, stitch_calls
from orchard_async.recipes.claw.task import ClawOptions
from orchard_async.records.trajectory import TurnTokens

SOURCES = Path(__file__).parent / "sandbox"
HARNESS_SOURCE = SOURCES / "claw_harness.py"
HARNESS_PATH = "/tmp/claw/harness.py"
DEFAULT_COMMAND = f"python3 {HARNESS_PATH}"
MINI_SWE_AGENT_VERSION = "2.4.6"
# mini-swe-agent (pip) in a sandbox image, built here: `orchard-async images build orchard/claw-mini-swe-agent:bookworm`
MINI_SWE_AGENT_IMAGE = ImageSpec(
    tag="orchard/claw-mini-swe-agent:bookworm",
    base="debian-minbase",
    apt_packages=("python3", "python3-pip"),
    pip_packages=(f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}",),
    check="mini --help >/dev/null && python3 -c 'import minisweagent, litellm'",
)
# Its task from stdin, the model through the proxy (litellm's openai provider), no prompts, no
# cost tracking (a served model has no price), nothing fetched at start (the sandbox is offline).
MINI_SWE_AGENT_COMMAND = (
    "task=$(cat); export MSWEA_CONFIGURED=true MSWEA_SILENT_STARTUP=1 MSWEA_COST_TRACKING=ignore_errors "
    "LITELLM_LOCAL_MODEL_COST_MAP=True MSWEA_GLOBAL_CONFIG_DIR=/tmp/claw/mini-home; "
    'exec mini -y --exit-immediately -l 0 -m "openai/$OPENAI_MODEL" -c mini.yaml -c /tmp/claw/mini_claw.yaml '
    '-c "model.model_kwargs.api_base=$OPENAI_BASE_URL" -o /tmp/claw/mini.traj.json -t "$task"'
)
# preset name -> (command, files copied into the sandbox first)
PRESETS: dict[str, tuple[str, dict[str, Path]]] = {
    "bundled": (DEFAULT_COMMAND, {HARNESS_PATH: HARNESS_SOURCE}),
    "mini-swe-agent": (MINI_SWE_AGENT_COMMAND, {"/tmp/claw/mini_claw.yaml": SOURCES / "mini_claw.yaml"}),
}
HARNESS_SETTINGS = "CLAW_HARNESS_"  # the prefix of the harness's own variables, passed through to it
OUTPUT_TAIL = 4000  # characters of the harness's output kept in the last step
SCORING_MARGIN = 0.9  # of the agent's remaining time the harness may use: the replay steps need the rest


@dataclass
class HarnessRun:
    calls: list[ModelCall]
    exit_code: int | None
    reason: str
    output: str
    # each call's tokens (``stitch_calls``; None without them): what ``export tokens`` reads off the steps
    tokens: list[TurnTokens | None] = field(default_factory=list)


class HarnessPolicy:
    """Runs an agent harness in the sandbox; its model calls become the episode's steps."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        command: str | None = None,
        upstream: Upstream | None = None,
        env: Mapping[str, str] | None = None,
        tokens: bool = False,
    ):
        self.config = config
        self.env = dict(env or {})  # more variables for the harness (CLAW_HARNESS_STREAM=1, its own settings)
        preset = command or "bundled"
        self.command, self.files = PRESETS.get(preset, (preset, {}))
        self.upstream = upstream or Upstream.from_model_config(config)
        if tokens:  # ask the backend for ids and logprobs: each call's step then carries its TurnTokens
            self.upstream = dataclasses.replace(self.upstream, tokens=True)
        self.name = f"harness:{preset if preset in PRESETS else preset.split()[0]}:{config.model}"
        self.proxy: ModelProxy | None = None
        self._starting = anyio.Lock()
        self.runs: dict[str, HarnessRun] = {}

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

    async def _proxy(self) -> ModelProxy:
        async with self._starting:
            if self.proxy is None:
                self.proxy = await ModelProxy(self.upstream).start()
            return self.proxy

    async def act(self, observation: Observation) -> Action:
        if observation.step == 0:
            self.runs[observation.episode_id] = await self._run(observation)
        run = self.runs.get(observation.episode_id)
        if run is None:
            raise RuntimeError("harness mode: the episode's harness run is missing (its first step did not run here)")
        if observation.step < len(run.calls):
            call = run.calls[observation.step]
            return Action(
                command=f": model call {call.index + 1} of {len(run.calls)}",
                raw=msgspec.json.encode(call).decode(),
                usage=call.usage,
                tokens=run.tokens[observation.step] if run.tokens else None,
            )
        del self.runs[observation.episode_id]
        summary = {"harness": self.command, "exit_code": run.exit_code, "reason": run.reason, "output": run.output}
        return Action(kind="submit", raw=json.dumps(summary))

    async def _run(self, observation: Observation) -> HarnessRun:
        task = observation.task
        sandboxes = getattr(task, "sandboxes", None)
        sandbox = sandboxes.pop(episode_label(observation.episode_id), None) if sandboxes is not None else None
        if sandbox is None:
            raise TypeError("harness mode needs Claw tasks (their setup hands the policy the agent's sandbox)")
        proxy = await self._proxy()
        session = proxy.open_session(observation.episode_id, max_calls=max(1, task.max_steps - 1))
        for path, source in self.files.items():
            # through the shell: an adapter's write_file may only reach the working directory
            copied = await sandbox.exec(f"cat > {path}", stdin=source.read_bytes(), timeout=task.exec_timeout)
            if not copied.ok:
                raise RuntimeError(f"harness mode: cannot copy {path} in: {copied.error_text or copied.text}")
        timeout = max(1.0, (observation.remaining or task.exec_timeout) * SCORING_MARGIN)
        try:
            async with serve_into(sandbox, proxy.port) as port:
                env = {
                    **self.env,
                    "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
                    "OPENAI_API_KEY": session.key,
                    "OPENAI_MODEL": self.config.model,
                    "CLAW_MAX_TURNS": str(session.max_calls),
                }
                result = await sandbox.exec(
                    self.command, env=env, stdin=observation.instruction.encode(), timeout=timeout
                )
        finally:
            calls = proxy.close_session(session)
        answered = [call for call in calls if 0 < call.status < 400]
        if calls and not answered and all(call.status >= 500 for call in calls):
            raise ModelUnavailable(f"{self.upstream.base_url}: every call of the harness failed ({calls[-1].status})")
        output = result.text + result.error_text
        tokens = stitch_calls(calls) if self.upstream.tokens else []
        return HarnessRun(calls, result.exit_code, result.reason.value, output[-OUTPUT_TAIL:], tokens)

    async def close(self) -> None:
        if self.proxy is not None:
            await self.proxy.close()
            self.proxy = None

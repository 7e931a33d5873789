"""Harness mode, the part every recipe shares: an agent harness (a CLI agent) runs inside the
agent's sandbox, and every model call it makes goes through the controller's recording proxy
(``orchard_async.models.proxy``).

``SandboxHarness.act`` at an episode's first step runs the harness command in the sandbox with
the instruction on stdin and ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL``
pointing at the proxy as the sandbox sees it (a relay on the sandbox's loopback, carried over
one stream: the sandbox's network stays off). The key is the episode's own; the upstream's real
key never enters the sandbox. The proxy grants ``max_calls`` calls (``max_steps - 1`` by
default: one step per call, then the submit).

The trajectory then gets one step per recorded call, in order: the step's ``action.raw`` is
the ``ModelCall`` as JSON (request messages and tools, the response, usage, latency,
status), its ``usage`` the call's tokens, its command a no-op naming the call. With
``tokens=True`` the proxy asks the backend for token ids and logprobs, and each call's step
also carries its ``TurnTokens`` (``action.tokens``, from ``stitch_calls``). The last step
submits, its ``raw`` the harness's exit status and the tail of its output. A harness whose
every call failed on the upstream's side raises ``ModelUnavailable``: never a reward.

A recipe says how its tasks hand over the agent's sandbox (``sandbox_for``) and may wrap the
command (``command_for``: another user, a working directory) and add variables
(``harness_env``); the presets (commands and the files they need copied in) are the recipe's.
A recipe's own stdlib harness script is a preset through ``bundled_harness``, which ships
``sandbox/harness_chat.py`` (the model client and the tool-calling loop) next to it.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import msgspec

from orchard_async.errors import ModelUnavailable
from orchard_async.models.client import ModelConfig
from orchard_async.models.proxy import ModelCall, ModelProxy, Upstream, serve_into, stitch_calls
from orchard_async.protocols import Sandbox
from orchard_async.records.trajectory import Action, TurnTokens
from orchard_async.task import Observation

MINI_SWE_AGENT_SETTINGS = (
    "MSWEA_CONFIGURED=true MSWEA_SILENT_STARTUP=1 MSWEA_COST_TRACKING=ignore_errors LITELLM_LOCAL_MODEL_COST_MAP=True"
)
OUTPUT_TAIL = 4000  # characters of the harness's output kept in the last step
SCORING_MARGIN = 0.9  # of the agent's remaining time the harness may use: the replay steps need the rest
HARNESS_CHAT = Path(__file__).parent / "sandbox" / "harness_chat.py"  # what every bundled harness imports


def bundled_harness(path: str, source: Path) -> tuple[str, dict[str, Path]]:
    """A recipe's stdlib harness script as a preset: the command that runs it from ``path`` in
    the sandbox, and the files to copy in: the script and, next to it, ``harness_chat``, which
    it imports (``python3 FILE`` puts the file's folder on ``sys.path``)."""
    chat = posixpath.join(posixpath.dirname(path), HARNESS_CHAT.name)
    return f"python3 {shlex.quote(path)}", {path: source, chat: HARNESS_CHAT}


def mini_swe_agent_command(home: str, *configs: str) -> str:
    """mini-swe-agent (``mini``, which the image must have) as a harness: its task from stdin,
    the model through the proxy (litellm's openai provider), its own ``mini.yaml`` and then
    ``configs`` (files in the sandbox), its state below ``home``. No prompts, no cost tracking
    (a served model has no price), nothing fetched at start (the sandbox may be offline)."""
    extra = "".join(f"-c {config} " for config in configs)
    return (
        f"task=$(cat); export {MINI_SWE_AGENT_SETTINGS} MSWEA_GLOBAL_CONFIG_DIR={home}/mini-home; "
        f'exec mini -y --exit-immediately -l 0 -m "openai/$OPENAI_MODEL" -c mini.yaml {extra}'
        f'-c "model.model_kwargs.api_base=$OPENAI_BASE_URL" -o {home}/mini.traj.json -t "$task"'
    )


@dataclass
class HarnessRun:
    calls: list[ModelCall]
    exit_code: int | None
    reason: str
    output: str
    # each call's tokens (``stitch_calls``; None without them): what ``export tokens`` reads off the steps
    tokens: list[TurnTokens | None] = field(default_factory=list)


class SandboxHarness:
    """Runs an agent harness in the sandbox; its model calls become the episode's steps.
    ``command`` is the shell command; ``files`` (sandbox path -> local file) are copied in
    first; ``env`` goes to the harness as it is."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        command: str,
        files: Mapping[str, Path] | None = None,
        name: str | None = None,
        upstream: Upstream | None = None,
        env: Mapping[str, str] | None = None,
        tokens: bool = False,
    ):
        self.config = config
        self.command = command
        self.files = dict(files or {})
        self.env = dict(env or {})
        self.upstream = upstream or Upstream.from_model_config(config)
        if tokens:  # ask the backend for ids and logprobs: each call's step then carries its TurnTokens
            self.upstream = dataclasses.replace(self.upstream, tokens=True)
        self.name = name or f"harness:{command.split()[0]}:{config.model}"
        self.proxy: ModelProxy | None = None
        self._starting = anyio.Lock()
        self.runs: dict[str, HarnessRun] = {}

    # -- what a recipe says ------------------------------------------------------------------

    def sandbox_for(self, observation: Observation) -> Sandbox:
        """The agent's sandbox of this episode, as the recipe's task hands it over."""
        raise TypeError(f"{type(self).__name__}: harness mode needs a recipe that hands over the agent's sandbox")

    def max_calls(self, observation: Observation) -> int:
        return max(1, observation.task.max_steps - 1)

    def harness_env(self, observation: Observation, max_calls: int) -> dict[str, str]:
        """More variables for this run (a recipe's own, e.g. a turn limit)."""
        return {}

    def command_for(self, observation: Observation, command: str, env: Mapping[str, str]) -> str:
        """The command as it runs in the sandbox with ``env`` (also passed to the exec; a recipe
        may run it as another user, setting ``env`` itself)."""
        return command

    # -- the run -----------------------------------------------------------------------------

    async def _proxy(self) -> ModelProxy:
        async with self._starting:
            if self.proxy is None:
                self.proxy = await ModelProxy(self.upstream).start()
            return self.proxy

    async def act(self, observation: Observation) -> Action:
        if observation.step == 0:
            self.runs[observation.episode_id] = await self.run(observation)
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
        self.episode_ended(observation.episode_id)
        summary = {"harness": self.command, "exit_code": run.exit_code, "reason": run.reason, "output": run.output}
        return Action(kind="submit", raw=json.dumps(summary))

    def episode_ended(self, episode_id: str) -> None:
        """The episode ended (protocols.Policy; the engine calls it however it ended): its
        harness run's calls, replayed as its steps, are not needed again."""
        self.runs.pop(episode_id, None)

    async def run(self, observation: Observation) -> HarnessRun:
        """The harness once, start to end, in the episode's sandbox; its calls as recorded."""
        task = observation.task
        sandbox = self.sandbox_for(observation)
        proxy = await self._proxy()
        max_calls = self.max_calls(observation)
        session = proxy.open_session(observation.episode_id, max_calls=max_calls)
        for path, source in self.files.items():
            # through the shell: an adapter's write_file may only reach the working directory
            # readable by every user: a recipe may run the harness as the task's agent user
            target, folder = shlex.quote(path), shlex.quote(posixpath.dirname(path))
            copy = f"mkdir -p {folder} && cat > {target} && chmod a+r {target}"
            copied = await sandbox.exec(copy, stdin=source.read_bytes(), timeout=task.exec_timeout)
            if not copied.ok:
                raise RuntimeError(f"harness mode: cannot copy {path} in: {copied.error_text or copied.text}")
        timeout = max(1.0, (observation.remaining or task.exec_timeout) * SCORING_MARGIN)
        try:
            async with serve_into(sandbox, proxy.port) as port:
                env = {
                    **self.env,
                    **self.harness_env(observation, max_calls),
                    "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
                    "OPENAI_API_KEY": session.key,
                    "OPENAI_MODEL": self.config.model,
                }
                result = await sandbox.exec(
                    self.command_for(observation, self.command, env),
                    env=env,
                    stdin=observation.instruction.encode(),
                    timeout=timeout,
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

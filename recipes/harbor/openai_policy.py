"""A terminal agent over an OpenAI-compatible chat endpoint (``ModelConfig.from_env``): each
reply holds one ```bash block, run in the task's sandbox as the task's agent user in its
workdir; ``submit`` (or ``echo COMPLETE``) ends the agent phase and the verifier runs.

A reply without exactly one block is an ``invalid`` action the model is told about; the
server's failures mean what they mean for every model policy of the project
(``orchard_async.models.client``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from orchard_async import Action, ContextExhausted, Observation
from orchard_async.models.client import ChatClient, ModelConfig

SYSTEM_PROMPT = """You are an agent working in a Linux terminal to complete a task.
Reply with a short THOUGHT, then exactly one command in a ```bash block; it runs in the task's
working directory and you will see its output. When the task is done, reply with
```bash
submit
```
Tests you cannot see check your work after you submit."""
OBSERVATION_CHARS = 10_000
_BLOCK = re.compile(r"```(?:bash|sh)\s*\n(.*?)```", re.DOTALL)
SUBMIT = ("submit", "echo COMPLETE")


def parse_reply(text: str, wrap: Any) -> Action:
    blocks = _BLOCK.findall(text)
    if len(blocks) != 1:
        return Action(kind="invalid", raw=text, error=f"expected exactly one ```bash block, found {len(blocks)}")
    command = blocks[0].strip()
    if not command:
        return Action(kind="invalid", raw=text, error="the ```bash block is empty")
    if command in SUBMIT:
        return Action(kind="submit", command="submit", raw=text)
    return Action(kind="exec", command=wrap(command), raw=text)


def messages_for(observation: Observation, system_prompt: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": observation.instruction},
    ]
    for step in observation.history:
        if step.action.raw:
            messages.append({"role": "assistant", "content": step.action.raw})
        if step.action.kind != "submit":
            text = step.observation
            if len(text) > OBSERVATION_CHARS:
                half = OBSERVATION_CHARS // 2
                text = f"{text[:half]}\n[... {len(text) - OBSERVATION_CHARS} characters elided ...]\n{text[-half:]}"
            messages.append({"role": "user", "content": f"exit code {step.exit_code}\n{text}"})
    return messages


class TerminalAgent:
    """The recipe's ``openai`` policy."""

    def __init__(self, config: ModelConfig, *, system_prompt: str = SYSTEM_PROMPT):
        self.config = config
        self.client = ChatClient(config)
        self.system_prompt = system_prompt
        self.name = f"openai:{config.model}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> TerminalAgent:
        return cls(ModelConfig.from_env(environ, **overrides))

    async def act(self, observation: Observation) -> Action:
        task = observation.task
        wrap = getattr(task, "agent_command", lambda command: command)
        completion = await self.client.complete(
            messages_for(observation, self.system_prompt), time_left=observation.remaining or None
        )
        if completion.content is None:
            return Action(kind="invalid", error=f"malformed response: {completion.error}", usage=completion.usage)
        action = parse_reply(completion.content, wrap)
        action.usage = completion.usage
        if completion.finish_reason == "length" and action.kind == "invalid" and self.config.max_tokens is None:
            raise ContextExhausted("the server cut the reply off with no command in it: the context is full")
        return action

    async def close(self) -> None:
        await self.client.close()

"""A policy backed by an OpenAI-compatible chat-completions endpoint (vLLM, SGLang, OpenAI...).

Configured from the environment (``OpenAIPolicy.from_env``): ``ModelConfig.from_env`` in
``orchard_async.models.client`` lists the variables (docs/variables.md too).

Retries back off exponentially with jitter and honour ``Retry-After``. Token usage of
every reply is recorded in the step's ``Action.usage``. A response without a readable
message, or a reply without exactly one bash block, becomes an ``invalid`` action: the
episode records the format error and goes on.

What the server's failures mean for the episode (none of them is the policy's own doing,
so none of them becomes training data with reward 0):

* the conversation no longer fits the model's context (an HTTP 400/413/422 whose error
  names the context length, or a reply cut off by the server with no usable command while
  the per-reply ``max_tokens`` was not what cut it) -> ``ContextExhausted``: the episode
  ends as ``context_exhausted`` and is scored on what the agent left in the tree;
* the model cannot be reached or will not serve us (401/403/404, connection refused,
  429/5xx/timeouts until the retries are spent) -> ``ModelUnavailable``, an infrastructure
  error: the engine retries the episode, then records ``model_unavailable``;
* any other rejected request (a 4xx such as a bad parameter in ``ORCHARD_EXTRA_BODY``)
  -> ``ModelError``: the episode ends as ``policy_error`` (never exported).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchard_async import Action, ContextExhausted, Observation
from orchard_async.models.client import ChatClient, Completion, ModelConfig, ModelError
from orchard_async.recipes.swe.agent import (
    OBSERVATION_CHARS,
    SYSTEM_PROMPT,
    build_messages,
    parse_reply,
    tokens_spent,
)

__all__ = [
    "ChatClient",
    "ModelConfig",
    "ModelError",
    "OpenAIPolicy",
]  # the client's names, for code that imports them here


class OpenAIPolicy:
    """The bash-only agent with a chat model choosing each command."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        system_prompt: str = SYSTEM_PROMPT,
        observation_chars: int = OBSERVATION_CHARS,
    ):
        self.config = config
        self.client = ChatClient(config)
        self.system_prompt = system_prompt
        self.observation_chars = observation_chars
        self.name = f"openai:{config.model}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> OpenAIPolicy:
        return cls(ModelConfig.from_env(environ, **overrides))

    async def act(self, observation: Observation) -> Action:
        spent = tokens_spent(observation.history)
        if self.config.token_budget and spent >= self.config.token_budget:
            return Action(
                kind="submit",
                command="submit",
                error=f"token budget spent ({spent} of {self.config.token_budget} tokens)",
            )
        messages = build_messages(
            observation.instruction,
            observation.history,
            system_prompt=self.system_prompt,
            observation_chars=self.observation_chars,
        )
        completion = await self.client.complete(messages, time_left=observation.remaining or None)
        if completion.content is None:
            return Action(kind="invalid", error=f"malformed response: {completion.error}", usage=completion.usage)
        action = parse_reply(completion.content)
        action.usage = completion.usage
        if completion.finish_reason == "length" and action.kind == "invalid":
            if self._cut_by_context(completion):
                raise ContextExhausted(
                    f"the server cut the reply off with no command in it after "
                    f"{completion.usage.get('completion_tokens', '?')} tokens: the context is full"
                )
            action.error += " (the reply was cut off at the token limit)"
        return action

    def _cut_by_context(self, completion: Completion) -> bool:
        """A reply cut off (``finish_reason == "length"``) hit either the per-reply cap we
        asked for, which the model can recover from by writing less (a format error, the
        episode goes on), or the end of the context window, from which no turn can recover.
        Without a cap of ours, the server's cut is the context's (vLLM and SGLang size an
        unset ``max_tokens`` to the room left in the context)."""
        cap = self.config.max_tokens
        if cap is None:
            return True
        return completion.usage.get("completion_tokens", cap) < cap

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self) -> OpenAIPolicy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

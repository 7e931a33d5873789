"""A multimodal chat model as a GUI policy, over any OpenAI-compatible endpoint.

Configured from the environment like the SWE recipe's policy (``OPENAI_BASE_URL``,
``OPENAI_API_KEY``, ``ORCHARD_MODEL``, ``ORCHARD_TEMPERATURE``, ...; see
``orchard_async.recipes.swe.openai_policy``), plus:

    ORCHARD_GUI_ADDRESSING    element (default: ids from the accessibility tree) or coordinates
    ORCHARD_GUI_SCREENSHOTS   how many of the latest screenshots the model sees (default 3; 0 = text only)

Each turn the model gets the task, then for every step its own reply and what followed:
the action's feedback, URL, tabs and accessibility tree as text, and the screenshot as an
image part (only the last K, older ones are replaced by a note). It answers with one action
as JSON (or a call like ``click(element=12)``); a reply that is not one valid action is a
format error shown to it, and three in a row end the episode. After ``answer`` the episode
is submitted. The conversation is rebuilt from the episode's steps on every turn.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping
from typing import Any

from orchard_async import Action, ConfigError, Observation, Step
from orchard_async.recipes.swe.openai_policy import ChatClient, ModelConfig

from . import actions
from .policies import answered

PARSE_FAILURES_LIMIT = 3  # format errors in a row that end the episode
SCREENSHOT_LINE = re.compile(r"^screenshot: sha256=([0-9a-f]{64})", re.MULTILINE)
OBSERVATION_CHARS = 12_000


def system_prompt(addressing: str) -> str:
    lines = []
    for tool in actions.tool_schemas(addressing):
        function = tool["function"]
        params = ", ".join(
            f"{name}{'' if name in function['parameters']['required'] else '?'}"
            for name in function["parameters"]["properties"]
        )
        lines.append(f"- {function['name']}({params}): {function['description']}")
    how = (
        "Name elements by the number in [brackets] at the start of their line in the accessibility tree."
        if addressing == "element"
        else "Name points of the screenshot by their x and y in pixels (the screenshot is the viewport)."
    )
    return (
        "You are a web agent. You operate a browser to complete the user's task on the sites of this environment.\n\n"
        "Each turn you see the result of your last action, the page's URL and tabs, its accessibility tree and a "
        "screenshot. Reply with a short thought, then exactly one action as a JSON object in a ```json block, e.g.\n"
        '```json\n{"action": "click", "element": "12"}\n```\n\n'
        "Actions (? = optional):\n" + "\n".join(lines) + f"\n\n{how} When the task is done, or asks a question, "
        "reply with the answer action; the episode ends after it."
    )


class GuiOpenAIPolicy:
    def __init__(self, config: ModelConfig, *, addressing: str = "element", screenshots: int = 3):
        if addressing not in ("element", "coordinates"):
            raise ConfigError(f"ORCHARD_GUI_ADDRESSING must be element or coordinates, got {addressing!r}")
        if screenshots < 0:
            raise ConfigError("ORCHARD_GUI_SCREENSHOTS must be 0 or more")
        self.config = config
        self.client = ChatClient(config)
        self.addressing = addressing
        self.screenshots = screenshots
        self.system_prompt = system_prompt(addressing)
        self.name = f"openai:{config.model}"
        self._images: dict[str, dict[str, str]] = {}  # episode -> screenshot hash -> base64

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> GuiOpenAIPolicy:
        env = os.environ if environ is None else environ
        try:
            screenshots = int(env.get("ORCHARD_GUI_SCREENSHOTS", "3") or 3)
        except ValueError:
            raise ConfigError("ORCHARD_GUI_SCREENSHOTS must be a whole number") from None
        return cls(
            ModelConfig.from_env(environ, **overrides),
            addressing=env.get("ORCHARD_GUI_ADDRESSING", "element") or "element",
            screenshots=screenshots,
        )

    async def act(self, observation: Observation) -> Action:
        if answered(observation):
            self._images.pop(observation.episode_id, None)
            return Action(kind="submit", command="submit", raw='{"action": "submit"}')
        recent = observation.history[-PARSE_FAILURES_LIMIT:]
        if len(recent) == PARSE_FAILURES_LIMIT and all(step.action.kind == "invalid" for step in recent):
            self._images.pop(observation.episode_id, None)
            return Action(
                kind="submit", command="submit", error="parse_failures: three replies in a row were not actions"
            )
        messages = await self.build_messages(observation)
        completion = await self.client.complete(messages, time_left=observation.remaining or None)
        if completion.content is None:
            return Action(kind="invalid", error=f"malformed response: {completion.error}", usage=completion.usage)
        try:
            action = actions.validate(actions.parse_text(completion.content))
        except actions.ActionParseError as exc:
            return Action(kind="invalid", raw=completion.content, error=str(exc), usage=completion.usage)
        return actions.to_action(action, raw=completion.content, usage=completion.usage)

    async def build_messages(self, observation: Observation) -> list[dict[str, Any]]:
        """The conversation so far, with the last K screenshots as image parts."""
        intent, _, first_page = observation.instruction.partition("\n\nThe browser shows:\n")
        turns: list[tuple[str | None, str]] = [(None, f"Task: {intent}\n\n{first_page}")]  # (assistant, user text)
        for step in observation.history:
            turns.append((step.action.raw or step.action.command, self._observation_text(step)))
        hashes = [match.group(1) if (match := SCREENSHOT_LINE.search(text)) else "" for _, text in turns]
        shown = {index for index, digest in enumerate(hashes) if digest}
        shown = set(sorted(shown)[-self.screenshots :]) if self.screenshots else set()
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt}]
        cache = self._images.setdefault(observation.episode_id, {})
        for index, (assistant, text) in enumerate(turns):
            if assistant is not None:
                messages.append({"role": "assistant", "content": assistant})
            text = text[:OBSERVATION_CHARS]
            if index not in shown:
                note = "\n(screenshot omitted: only the latest are shown)" if hashes[index] else ""
                messages.append({"role": "user", "content": text + note})
                continue
            image = cache.get(hashes[index])
            if image is None:
                data = await _screenshot(observation, hashes[index])
                image = base64.b64encode(data).decode() if data else ""
                cache[hashes[index]] = image
            parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
            if image:
                parts.append({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}})
            messages.append({"role": "user", "content": parts})
        for digest in list(cache):  # keep only what the next turn can show
            if digest not in {hashes[index] for index in shown}:
                del cache[digest]
        return messages

    @staticmethod
    def _observation_text(step: Step) -> str:
        if step.action.kind == "invalid":
            return f"Format error: {step.action.error}. Reply with one action as a JSON object in a ```json block."
        return step.observation or f"(no output; the step ended with {step.reason or 'no result'})"

    async def aclose(self) -> None:
        await self.client.aclose()


async def _screenshot(observation: Observation, digest: str) -> bytes | None:
    fetch = getattr(observation.task, "screenshot", None)
    return await fetch(observation.episode_id, digest) if fetch else None

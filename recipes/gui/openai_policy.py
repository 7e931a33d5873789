"""A multimodal chat model as a GUI policy, over any OpenAI-compatible endpoint.

The model is configured like the SWE recipe's policy (``ModelConfig``: ``OPENAI_BASE_URL``,
``OPENAI_API_KEY``, ``ORCHARD_MODEL``, ``ORCHARD_TEMPERATURE``, ...), the rest by the recipe's
options (``GuiOptions``): ``addressing`` (element ids from the accessibility tree, or
coordinates), ``last_screenshots`` (how many of the latest screenshots the model sees; 0 = text
only) and ``marks`` (observations carry set-of-marks; the prompt says how to read them).
docs/variables.md lists the variables that give their defaults.

Each turn the model gets the task, then for every step its own reply and what followed:
the action's feedback, URL, tabs and accessibility tree as text, and the screenshot as an
image part (only the last K, older ones are replaced by a note). It answers with one action
as JSON (or a call like ``click(element=12)``); a reply that is not one valid action is a
format error shown to it, and the task's ``parse_failure_limit`` (3) in a row end the
episode as ``parse_failures``. After ``answer`` the episode is submitted. The conversation
is rebuilt from the episode's steps on every turn (``conversation``, which the export uses too).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from orchard_async import Action, ConfigError, Observation
from orchard_async.models.client import ChatClient, ModelConfig
from orchard_async.recipes.gui import actions
from orchard_async.recipes.gui.conversation import conversation, fill_images, system_prompt
from orchard_async.recipes.gui.policies import answered
from orchard_async.recipes.gui.task import DEFAULT_SCREENSHOTS, GuiOptions


class GuiOpenAIPolicy:
    def __init__(
        self,
        config: ModelConfig,
        *,
        addressing: str = "element",
        screenshots: int = DEFAULT_SCREENSHOTS,
        marks: bool = False,
    ):
        if addressing not in ("element", "coordinates"):
            raise ConfigError(f"addressing must be element or coordinates, got {addressing!r}")
        if screenshots < 0:
            raise ConfigError("the model's last screenshots must be 0 or more")
        self.config = config
        self.client = ChatClient(config)
        self.addressing = addressing
        self.screenshots = screenshots
        self.system_prompt = system_prompt(addressing, marks)
        self.name = f"openai:{config.model}"
        self._images: dict[str, dict[str, str]] = {}  # episode -> screenshot hash -> base64

    @classmethod
    def from_options(cls, options: GuiOptions, config: ModelConfig) -> GuiOpenAIPolicy:
        return cls(config, addressing=options.addressing, screenshots=options.last_screenshots, marks=options.marks)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> GuiOpenAIPolicy:
        """The model's settings and the recipe's options, both from ``environ`` (default: this process's)."""
        return cls.from_options(GuiOptions.from_env(environ), ModelConfig.from_env(environ, **overrides))

    async def act(self, observation: Observation) -> Action:
        if answered(observation):
            self.episode_ended(observation.episode_id)
            return Action(kind="submit", command="submit", raw='{"action": "submit"}')
        messages = await self.build_messages(observation)
        completion = await self.client.complete(messages, time_left=observation.remaining or None)
        if completion.content is None:
            return Action(kind="invalid", error=f"malformed response: {completion.error}", usage=completion.usage)
        try:
            action = actions.validate(actions.parse_text(completion.content))
        except actions.ActionParseError as exc:
            return Action(kind="invalid", raw=completion.content, error=str(exc), usage=completion.usage)
        return actions.to_action(action, raw=completion.content, usage=completion.usage)

    def episode_ended(self, episode_id: str) -> None:
        """The episode ended (protocols.Policy; the engine calls it however it ended): its
        screenshots' encodings are not needed again."""
        self._images.pop(episode_id, None)

    async def build_messages(self, observation: Observation) -> list[dict[str, Any]]:
        """The conversation so far, with the last K screenshots as image parts."""
        messages, shown = conversation(
            observation.instruction, observation.history, prompt=self.system_prompt, screenshots=self.screenshots
        )
        cache = self._images.setdefault(observation.episode_id, {})
        for digest in shown:
            if digest not in cache:
                data = await _screenshot(observation, digest)
                cache[digest] = base64.b64encode(data).decode() if data else ""
        for digest in list(cache):  # keep only what the next turn can show
            if digest not in shown:
                del cache[digest]
        urls = {digest: f"data:image/png;base64,{image}" if image else None for digest, image in cache.items()}
        return fill_images(messages, urls)

    async def close(self) -> None:
        await self.client.close()


async def _screenshot(observation: Observation, digest: str) -> bytes | None:
    fetch = getattr(observation.task, "screenshot", None)
    return await fetch(observation.episode_id, digest) if fetch else None

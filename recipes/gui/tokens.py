"""What a token-in/token-out policy (``--policy tokens``) gets of the GUI recipe.

A token policy samples a text model, so it sees the page as text: each observation's
feedback, URL, tabs and accessibility tree (and, with ``marks``, the marks' list), the same
text the openai policy's model reads beside its screenshot, with the screenshot's line left
out and no image. Its chat is the GUI conversation's text-only form (``conversation(...,
text_only=True)``): no earlier message changes as the episode goes on (the openai policy's
chat drops older images each turn, which no token sequence can follow), so each turn's
prompt extends the last. Element addressing only: coordinates point into a screenshot the
model never sees.

The module gives the token policy the recipe's three seams: ``token_chats`` (the chat),
``parse_reply`` (a reply -> one GUI action, as the openai policy parses it) and
``automatic_action`` (the recipe's own ``submit`` after an answer, which no model is asked for).
"""

from __future__ import annotations

from typing import Any

from orchard_async import Action, ConfigError, Observation, Trajectory
from orchard_async.recipes.gui import actions
from orchard_async.recipes.gui.conversation import conversation, model_steps, system_prompt
from orchard_async.recipes.gui.policies import answered
from orchard_async.recipes.gui.task import GuiOptions
from orchard_async.records import export as training_data


class TextChats:
    """Each trajectory's text-only GUI chat, as a token policy sees it."""

    def __init__(self, marks: bool = False):
        self.prompt = system_prompt("element", marks, text_only=True)

    def __call__(self, trajectory: Trajectory) -> list[dict[str, Any]]:
        messages, _ = conversation(
            trajectory.instruction, model_steps(trajectory.steps), prompt=self.prompt, screenshots=0, text_only=True
        )
        return messages


def token_chats(options: dict[str, Any]) -> training_data.Chats:
    """The chat of ``--policy tokens`` (``options``: the recipe's, by name; the rest from the
    environment as ``GuiOptions`` reads it)."""
    resolved = GuiOptions.resolve(options)
    if resolved.addressing != "element":
        raise ConfigError(
            "the gui recipe's token policy sees the page as text: give addressing=element "
            "(coordinates point into a screenshot it never sees)"
        )
    return training_data.Chats(TextChats(resolved.marks))


def parse_reply(text: str) -> Action:
    """A model's reply -> one GUI action (a ```json block, or a call like ``click(element=12)``),
    or an invalid action saying why not."""
    try:
        action = actions.validate(actions.parse_text(text))
    except actions.ActionParseError as exc:
        return Action(kind="invalid", raw=text, error=str(exc))
    return actions.to_action(action, raw=text)


def automatic_action(observation: Observation) -> Action | None:
    """The recipe's own turn, which no model is asked for: ``submit`` once an answer is recorded."""
    if answered(observation):
        return Action(kind="submit", command="submit", raw='{"action": "submit"}')
    return None

"""The chat a GUI model sees, built from an episode's steps: one function for the policy
(each turn) and the export (training data), so the two never drift apart.

The messages come back with each shown screenshot as an image part whose URL is still the
screenshot's hash (``sha256:HEX``); ``fill_images`` swaps in real URLs (a data URL for the
model, a data URL or a file for training data) and drops an image that cannot be had.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from orchard_async import Step
from orchard_async.recipes.gui import actions
from orchard_async.recipes.gui.task import PAGE_MARKER

SCREENSHOT_LINE = re.compile(r"^screenshot: sha256=([0-9a-f]{64})", re.MULTILINE)
SCREENSHOT_TEXT_LINE = re.compile(r"^screenshot: sha256=[0-9a-f]{64}.*\n?", re.MULTILINE)  # the whole line
OBSERVATION_CHARS = 12_000
HASH_URL = "sha256:"


def system_prompt(addressing: str, marks: bool = False, *, text_only: bool = False) -> str:
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
    if marks:
        how += (
            " The screenshot has numbered boxes (set-of-marks) on the elements you can act on, listed under"
            " 'marks:' with their boxes (x,y,w,h in pixels); a mark's number is the element's id."
        )
    return (
        "You are a web agent. You operate a browser to complete the user's task on the sites of this environment.\n\n"
        "Each turn you see the result of your last action, the page's URL and tabs, its accessibility tree"
        + ("" if text_only else " and a screenshot")
        + ". Reply with a short thought, then exactly one action as a JSON object in a ```json block, e.g.\n"
        '```json\n{"action": "click", "element": "12"}\n```\n\n'
        "Actions (? = optional):\n" + "\n".join(lines) + f"\n\n{how} When the task is done, or asks a question, "
        "reply with the answer action; the episode ends after it."
    )


def observation_text(step: Step) -> str:
    if step.action.kind == "invalid":
        return f"Format error: {step.action.error}. Reply with one action as a JSON object in a ```json block."
    return step.observation or f"(no output; the step ended with {step.reason or 'no result'})"


def model_steps(steps: Sequence[Step]) -> list[Step]:
    """The steps that were the model's turns: a GUI episode's ``submit`` is the policy's own
    (it follows an answer without asking the model), never a reply to learn from."""
    return [step for step in steps if step.action.kind != "submit"]


def conversation(
    instruction: str, steps: Sequence[Step], *, prompt: str, screenshots: int, text_only: bool = False
) -> tuple[list[dict[str, Any]], list[str]]:
    """(messages, hashes of the screenshots shown, in order): the system prompt, the task and
    first page, then per step the model's reply and what followed. Only the latest
    ``screenshots`` observations carry their image; older ones say it was omitted.
    ``text_only``: no image and no word of one (a text model's chat: the screenshot's line
    is left out of each observation), so no earlier message changes as the episode goes on."""
    intent, _, first_page = instruction.partition(f"\n\n{PAGE_MARKER}\n")
    turns: list[tuple[str | None, str]] = [(None, f"Task: {intent}\n\n{first_page}")]  # (assistant, user text)
    for step in steps:
        turns.append((step.action.raw or step.action.command, observation_text(step)))
    if text_only:
        messages: list[dict[str, Any]] = [{"role": "system", "content": prompt}]
        for assistant, text in turns:
            if assistant is not None:
                messages.append({"role": "assistant", "content": assistant})
            messages.append({"role": "user", "content": SCREENSHOT_TEXT_LINE.sub("", text)[:OBSERVATION_CHARS]})
        return messages, []
    hashes = [match.group(1) if (match := SCREENSHOT_LINE.search(text)) else "" for _, text in turns]
    with_image = [index for index, digest in enumerate(hashes) if digest]
    shown = set(with_image[-screenshots:]) if screenshots > 0 else set()
    messages = [{"role": "system", "content": prompt}]
    for index, (assistant, text) in enumerate(turns):
        if assistant is not None:
            messages.append({"role": "assistant", "content": assistant})
        text = text[:OBSERVATION_CHARS]
        if index not in shown:
            note = "\n(screenshot omitted: only the latest are shown)" if hashes[index] else ""
            messages.append({"role": "user", "content": text + note})
            continue
        parts = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": HASH_URL + hashes[index]}}]
        messages.append({"role": "user", "content": parts})
    return messages, [hashes[index] for index in sorted(shown)]


def fill_images(messages: list[dict[str, Any]], urls: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """The messages with each image part's hash replaced by ``urls[hash]``; an image whose URL
    is None or missing is dropped (its text stays)."""
    for message in messages:
        if not isinstance(message["content"], list):
            continue
        parts = []
        for part in message["content"]:
            if part.get("type") == "image_url" and part["image_url"]["url"].startswith(HASH_URL):
                url = urls.get(part["image_url"]["url"][len(HASH_URL) :])
                if not url:
                    continue
                part = {"type": "image_url", "image_url": {"url": url}}
            parts.append(part)
        message["content"] = parts
    return messages

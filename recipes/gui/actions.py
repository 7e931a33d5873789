"""The GUI action set: one canonical form (a JSON object), two addressings, rendered as tool
schemas for models, and turned into the one command a step runs in the sandbox.

Element addressing (BrowserGym style) names an element by the id its accessibility-tree
line starts with; coordinate addressing (Qwen-VL / OpenWebRL style) names a point of the
screenshot in pixels. Navigation, tabs, ``wait`` and ``answer`` are shared::

    {"action": "click", "element": "12"}          {"action": "click", "x": 640, "y": 200}
    {"action": "fill", "element": "31", "text": "rain shell"}
    {"action": "select_option", "element": "40", "option": "Top rated"}
    {"action": "press", "key": "Enter"}            {"action": "press_keys", "keys": ["Control+a", "Delete"]}
    {"action": "scroll", "direction": "down"}      {"action": "write", "text": "hello"}
    {"action": "goto", "url": "http://127.0.0.1:7101/cart"}   {"action": "go_back"}
    {"action": "answer", "text": "Elderberry"}

Each step runs ``.gui/act '<json>'`` in the sandbox (the driver's client; the command runs
from the sandbox's work dir); its output is the next observation.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from orchard_async import Action

CLIENT = ".gui/act"
# name -> (required fields, optional fields); an action is exactly one of these
ACTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "click": ((), ("element", "x", "y")),
    "hover": (("element",), ()),
    "fill": (("element", "text"), ()),
    "select_option": (("element", "option"), ()),
    "press": (("key",), ("element",)),
    "press_keys": (("keys",), ()),
    "write": (("text",), ()),
    "scroll": ((), ("direction", "amount", "element", "x", "y")),
    "drag": (("x1", "y1", "x2", "y2"), ()),
    "goto": (("url",), ()),
    "go_back": ((), ()),
    "new_tab": ((), ("url",)),
    "switch_tab": (("index",), ()),
    "close_tab": ((), ("index",)),
    "wait": ((), ("seconds",)),
    "answer": (("text",), ()),
}
NUMBERS = {"x", "y", "x1", "y1", "x2", "y2", "amount", "seconds", "index"}


class ActionParseError(ValueError):
    """A reply that is not one valid action: feedback for the agent, counted."""


def validate(action: Any) -> dict[str, Any]:
    """A canonical action dict, or ActionParseError saying what is wrong with it."""
    if not isinstance(action, dict):
        raise ActionParseError(f"an action is a JSON object, got {type(action).__name__}")
    name = action.get("action")
    if name not in ACTIONS:
        raise ActionParseError(f"unknown action {name!r}; actions: {', '.join(ACTIONS)}")
    required, optional = ACTIONS[name]
    fields = {k: v for k, v in action.items() if k != "action"}
    missing = [k for k in required if fields.get(k) in (None, "") and not (k == "text" and fields.get(k) == "")]
    unknown = sorted(set(fields) - set(required) - set(optional))
    if missing or unknown:
        parts = [f"missing {', '.join(missing)}"] if missing else []
        parts += [f"unknown field {', '.join(unknown)}"] if unknown else []
        raise ActionParseError(f"{name}: {'; '.join(parts)}")
    if name == "click" and fields.get("element") in (None, "") and (fields.get("x") is None or fields.get("y") is None):
        raise ActionParseError("click needs an element id, or x and y")
    for key in NUMBERS & set(fields):
        if not isinstance(fields[key], int | float) or isinstance(fields[key], bool):
            try:
                fields[key] = float(fields[key]) if key not in ("index",) else int(fields[key])
            except (TypeError, ValueError):
                raise ActionParseError(f"{name}: {key} must be a number, got {fields[key]!r}") from None
    if "element" in fields and fields["element"] not in (None, ""):
        element = str(fields["element"]).strip().strip("[]")
        if not element.isdigit():
            raise ActionParseError(
                f"{name}: element is the number in [brackets] on a tree line, got {fields['element']!r}"
            )
        fields["element"] = element
    if name == "press_keys" and not (
        isinstance(fields["keys"], list) and all(isinstance(k, str) for k in fields["keys"])
    ):
        raise ActionParseError("press_keys: keys is a list of key names")
    return {"action": name, **fields}


def command(action: dict[str, Any]) -> str:
    """The sandbox command that performs one (validated) action."""
    return f"{CLIENT} {shlex.quote(json.dumps(action, ensure_ascii=False, separators=(',', ':')))}"


def to_action(action: dict[str, Any], raw: str = "", usage: dict[str, int] | None = None) -> Action:
    """A policy's Action for one GUI action (raw: the model's own reply, kept for export)."""
    action = validate(action)
    return Action(command=command(action), raw=raw or json.dumps(action), usage=usage or {})


def action_of(step_action: Action) -> dict[str, Any] | None:
    """The GUI action a recorded step ran, or None (a submit, an invalid reply, a foreign command)."""
    if step_action.kind != "exec" or not step_action.command.startswith(CLIENT + " "):
        return None
    try:
        return json.loads(shlex.split(step_action.command[len(CLIENT) + 1 :])[0])
    except (ValueError, IndexError):
        return None


_JSON_BLOCK = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)
_CALL = re.compile(r"^\s*([a-z_]+)\s*\((.*)\)\s*$", re.DOTALL)


def parse_text(text: str) -> dict[str, Any]:
    """A model's text reply -> one action. Accepts a ```json block (or a bare JSON object)
    or a call like ``click(element=12)`` / ``answer(text="Fig")`` on the reply's last line."""
    blocks = _JSON_BLOCK.findall(text)
    if len(blocks) > 1:
        raise ActionParseError(f"expected one action, found {len(blocks)} JSON blocks")
    candidates = blocks or [text[text.find("{") : text.rfind("}") + 1]] if "{" in text else []
    for candidate in candidates:
        try:
            return validate(json.loads(candidate))
        except json.JSONDecodeError:
            pass
    lines = [line for line in text.strip().splitlines() if line.strip()]
    match = _CALL.match(lines[-1]) if lines else None
    if match:
        name, args = match.groups()
        fields: dict[str, Any] = {}
        for key, value in re.findall(r"(\w+)\s*=\s*(\"(?:[^\"\\]|\\.)*\"|'[^']*'|\[[^\]]*\]|[^,]+)", args):
            value = value.strip()
            try:
                fields[key] = json.loads(value) if value[0] in '"[' else value.strip("'")
            except json.JSONDecodeError:
                fields[key] = value.strip("\"'")
            if isinstance(fields[key], str) and re.fullmatch(r"-?\d+(\.\d+)?", fields[key]):
                fields[key] = float(fields[key]) if "." in fields[key] else int(fields[key])
        return validate({"action": name, **fields})
    raise ActionParseError('no action found: reply with one JSON object like {"action": "click", "element": "12"}')


_DESCRIPTIONS = {
    "click": "Click an element (by its id from the tree) or a point of the screenshot (x, y in pixels).",
    "hover": "Move the mouse over an element.",
    "fill": "Replace the text of a text field (or set a date/time field, e.g. 2026-03-10) with text.",
    "select_option": "Choose an option of a select (dropdown) by its label.",
    "press": "Press a key (Enter, Tab, Escape, ArrowDown, a character, or a combination like Control+a), optionally on an element.",
    "press_keys": "Press several keys in order.",
    "write": "Type text where the keyboard focus is.",
    "scroll": "Scroll the page (or an element) up, down, left or right.",
    "drag": "Drag the mouse from (x1, y1) to (x2, y2).",
    "goto": "Open a URL in the current tab.",
    "go_back": "Go back to the previous page of the current tab.",
    "new_tab": "Open a new tab, optionally at a URL.",
    "switch_tab": "Make the tab with this index current.",
    "close_tab": "Close the tab with this index.",
    "wait": "Wait a few seconds for the page.",
    "answer": "Finish the task, giving the answer (or a short summary of what you did).",
}
_TYPES = {
    "element": "string",
    "text": "string",
    "option": "string",
    "key": "string",
    "url": "string",
    "direction": "string",
    "keys": "array",
}
ELEMENT_ACTIONS = ("click", "hover", "fill", "select_option", "press", "scroll")
COORDINATE_ACTIONS = ("click", "write", "scroll", "press_keys", "drag")
SHARED_ACTIONS = ("goto", "go_back", "new_tab", "switch_tab", "close_tab", "wait", "answer")


def tool_schemas(addressing: str = "element") -> list[dict[str, Any]]:
    """OpenAI tool definitions for one addressing ("element" or "coordinates")."""
    names = (ELEMENT_ACTIONS if addressing == "element" else COORDINATE_ACTIONS) + SHARED_ACTIONS
    tools = []
    for name in names:
        required, optional = ACTIONS[name]
        if name in ("click", "scroll"):
            coordinates = addressing != "element"
            fields = ("x", "y") if coordinates else ("element",)
            required = fields if name == "click" else ()
            optional = () if name == "click" else ("direction", "amount", *fields)
        properties: dict[str, Any] = {}
        for field in (*required, *optional):
            kind = _TYPES.get(field, "number" if field in NUMBERS else "string")
            properties[field] = {"type": kind} | ({"items": {"type": "string"}} if kind == "array" else {})
            if field == "direction":
                properties[field]["enum"] = ["up", "down", "left", "right"]
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": _DESCRIPTIONS[name],
                    "parameters": {"type": "object", "properties": properties, "required": list(required)},
                },
            }
        )
    return tools

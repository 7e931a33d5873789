"""Scripted GUI policies: ``oracle`` (plays each task's solution) and ``empty`` (answers nothing).

Both act only through what a model would see: the oracle's script names elements by role
and name (``{"role": "button", "name": "Add to cart"}``), resolved against the tree of the
current page, so a bundled task it solves is solvable from its observations.
"""

from __future__ import annotations

import json
import re
from typing import Any

from orchard_async import Action, Observation
from orchard_async.recipes.gui import actions
from orchard_async.recipes.gui.task import PAGE_MARKER

TREE_LINE = re.compile(r'^\s*\[(\d+)\] (\S+)(?: ("(?:[^"\\]|\\.)*"))?')


def current_page(observation: Observation) -> str:
    """The latest observation text: the last step's output, else the page setup opened."""
    for step in reversed(observation.history):
        if actions.action_of(step.action) is not None and step.observation:
            return step.observation
    _, _, page = observation.instruction.partition(PAGE_MARKER + "\n")
    return page


def answered(observation: Observation) -> bool:
    """Whether the last step recorded an answer: the episode is then submitted."""
    if not observation.history:
        return False
    last = observation.history[-1]
    action = actions.action_of(last.action)
    return bool(action and action.get("action") == "answer" and "answer recorded" in last.observation.split("\n", 1)[0])


def tree_nodes(page: str) -> list[tuple[str, str, str]]:
    """(element id, role, name) of every line of a page's tree."""
    _, _, tree = page.partition("\n---\n")
    nodes = []
    for line in tree.splitlines():
        match = TREE_LINE.match(line)
        if match:
            element, role, name = match.groups()
            nodes.append((element, role, json.loads(name) if name else ""))
    return nodes


def resolve(target: dict[str, Any], page: str) -> str:
    """The element id of the target's role and name on this page (``nth`` picks among equals;
    ``contains`` matches a part of the name)."""
    matches = [
        element
        for element, role, name in tree_nodes(page)
        if role == target.get("role", role)
        and (name == target["name"] if "name" in target else target.get("contains", "") in name)
    ]
    index = int(target.get("nth", 0))
    if len(matches) <= index:
        raise LookupError(f"no {target} on the page (the oracle's script no longer matches the site)")
    return matches[index]


class OraclePolicy:
    """Plays the task's solution; after its answer, submits."""

    name = "oracle"

    async def act(self, observation: Observation) -> Action:
        script = getattr(observation.task, "solution", None)
        if script is None:
            raise TypeError("the gui oracle needs GUI tasks (with a solution)")
        done = sum(1 for step in observation.history if actions.action_of(step.action) is not None)
        if answered(observation) or done >= len(script):
            return Action(kind="submit", command="submit", raw='{"action": "submit"}')
        planned = dict(script[done])
        target = planned.pop("target", None)
        if target is not None:
            planned["element"] = resolve(target, current_page(observation))
        return actions.to_action(planned)


class EmptyPolicy:
    """Answers nothing and submits at once: every bundled task must score 0."""

    name = "empty"

    async def act(self, observation: Observation) -> Action:
        if answered(observation):
            return Action(kind="submit", command="submit", raw='{"action": "submit"}')
        return actions.to_action({"action": "answer", "text": ""})

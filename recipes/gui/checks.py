"""The checks of a GUI task's ``eval`` list, each scored 0..1; the reward is their product.

* ``state_match``: a path in a site's ``/__state`` (``orders.0.items.*.product_id``; ``*``
  fans out over a list, and the check holds if any value matches) ``equals`` a value,
  ``contains`` a text (case-insensitive), or has ``length`` n.
* ``url_match``: the final URL ``equals`` or ``contains`` a text.
* ``string_match``: the agent's answer, normalized, is ``exact`` or ``must_include`` all of a list.
* ``program_html``: a JavaScript expression evaluated on the final page ``equals`` a value.
* ``purchase``: WebShop-style dense reward on the last order of the shop: the share of
  product, options and quantity that match, times 1 if the price limit holds.
* ``llm_judge``: a model's verdict on the task, the answer and the last screenshots (see
  ``judge``; scored by the task, since it needs the screenshots and a model).

What they read is what the grader got from the sandbox, after the agent was done: signed
by the sites and the driver (see ``inside/common.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from orchard_async import ConfigError

CHECK_TYPES = ("state_match", "url_match", "string_match", "program_html", "purchase", "llm_judge")


@dataclass
class Final:
    """What the grader read at the end of an episode."""

    answer: str | None
    url: str
    js: list[Any] = field(default_factory=list)
    states: dict[str, Any] = field(default_factory=dict)


def validate_check(check: Any, where: str) -> dict[str, Any]:
    if not isinstance(check, dict) or check.get("type") not in CHECK_TYPES:
        raise ConfigError(
            f"{where}: each eval entry is an object with a type among {', '.join(CHECK_TYPES)}, got {check!r}"
        )
    kind = check["type"]
    needs = {
        "state_match": ("site", "path"),
        "url_match": (),
        "string_match": (),
        "program_html": ("js",),
        "purchase": ("product_id",),
        "llm_judge": (),
    }[kind]
    missing = [k for k in needs if k not in check]
    if missing:
        raise ConfigError(f"{where}: a {kind} check needs {', '.join(missing)}")
    if kind == "state_match" and not {"equals", "contains", "length"} & set(check):
        raise ConfigError(f"{where}: a state_match check needs equals, contains or length")
    if kind == "url_match" and not {"equals", "contains"} & set(check):
        raise ConfigError(f"{where}: a url_match check needs equals or contains")
    if kind == "string_match" and not {"exact", "must_include"} & set(check):
        raise ConfigError(f"{where}: a string_match check needs exact or must_include")
    return check


def values_at(data: Any, path: str) -> list[Any]:
    """Every value at a dotted path; ``*`` fans out over the items of a list."""
    current = [data]
    for part in path.split(".") if path else []:
        following = []
        for value in current:
            if part == "*" and isinstance(value, list):
                following.extend(value)
            elif isinstance(value, list) and re.fullmatch(r"-?\d+", part):
                index = int(part)
                if -len(value) <= index < len(value):
                    following.append(value[index])
            elif isinstance(value, dict) and part in value:
                following.append(value[part])
        current = following
    return current


def normalize(text: Any) -> str:
    return re.sub(r"\s+", " ", str(text or "")).strip().lower().rstrip(".")


def _matches(value: Any, check: dict[str, Any]) -> bool:
    if "equals" in check:
        expected = check["equals"]
        if isinstance(expected, str) and isinstance(value, str):
            return normalize(value) == normalize(expected)
        return value == expected
    if "contains" in check:
        return normalize(check["contains"]) in normalize(value)
    return isinstance(value, list | dict | str) and len(value) == check["length"]


def score(check: dict[str, Any], final: Final, js_index: dict[int, int]) -> tuple[float, str]:
    """One check's score (0..1) and what it saw."""
    kind = check["type"]
    if kind == "state_match":
        state = final.states.get(check["site"])
        values = values_at(state, check["path"])
        ok = any(_matches(value, check) for value in values)
        return float(ok), f"{check['site']}:{check['path']} = {_short(values)}"
    if kind == "url_match":
        ok = _matches(final.url, check)
        return float(ok), f"url = {final.url}"
    if kind == "string_match":
        answer = normalize(final.answer)
        if final.answer is None:
            return 0.0, "no answer"
        if "exact" in check:
            ok = answer == normalize(check["exact"])
        else:
            ok = all(normalize(part) in answer for part in check["must_include"])
        return float(ok), f"answer = {final.answer!r}"
    if kind == "program_html":
        value = final.js[js_index[id(check)]] if id(check) in js_index and js_index[id(check)] < len(final.js) else None
        return float(value == check.get("equals", True)), f"js = {_short(value)}"
    return _purchase(check, final)


def _purchase(check: dict[str, Any], final: Final) -> tuple[float, str]:
    orders = (final.states.get("shop") or {}).get("orders") or []
    if not orders:
        return 0.0, "no order"
    items = orders[-1]["items"]
    best = 0.0
    for item in items:
        if item["product_id"] != check["product_id"]:
            continue
        wanted = dict(check.get("options", {}))
        if "qty" in check:
            wanted["qty"] = check["qty"]
        hits = 1 + sum(1 for key, value in wanted.items() if str(item.get(key)) == str(value))
        best = max(best, hits / (1 + len(wanted)))
    if "max_price" in check and orders[-1]["total"] > check["max_price"]:
        best = 0.0
    return best, f"last order items = {_short(items)}"


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."

"""The GUI recipe's task file format: one JSON task per line (``TaskLine``), read and checked
(``read_task_file``), and the bundled sites the tasks run on."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from orchard_async import ConfigError
from orchard_async.recipes.gui.checks import validate_check

SITES = {"shop": 7101, "booking": 7102, "forum": 7103}  # the bundled sites and their usual ports


class TaskLine(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    site: str
    start_url: str
    intent: str
    eval: list[dict[str, Any]]
    seed: int = 0
    difficulty: str = "medium"
    max_steps: int = 16
    solution: list[dict[str, Any]] = []
    network: str = "none"  # "on": a live site, judged by an LLM (not bundled)


def parse_task_line(text: str, where: str) -> TaskLine:
    try:
        line = msgspec.json.decode(text, type=TaskLine)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{where}: not a valid GUI task ({exc})") from None
    if line.site not in SITES and line.network != "on":
        raise ConfigError(f"{where}: unknown site {line.site!r}; bundled sites: {', '.join(SITES)}")
    if line.max_steps < 1:
        raise ConfigError(f"{where}: max_steps must be at least 1")
    if not line.eval:
        raise ConfigError(f"{where}: a task needs at least one eval check")
    for index, check in enumerate(line.eval):
        validate_check(check, f"{where} eval[{index}]")
    return line


def read_task_file(path: Path) -> list[TaskLine]:
    lines = []
    seen: set[str] = set()
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if not text.strip() or text.lstrip().startswith("//"):
            continue
        line = parse_task_line(text, f"{path.name}:{number}")
        if line.id in seen:
            raise ConfigError(f"{path.name}:{number}: task id {line.id!r} appears twice")
        seen.add(line.id)
        lines.append(line)
    return lines


def builtin_path() -> Path:
    return Path(str(resources.files(__package__).joinpath("tasks", "builtin.jsonl")))

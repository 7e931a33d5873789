"""Live-site task files in the GUI task schema: WebVoyager and Online-Mind2Web.

    orchard-async run gui --tasks webvoyager:WebVoyager_data.jsonl --policy openai ...
    orchard-async run gui --tasks mind2web:Online_Mind2Web.json ...

Each becomes a task with ``network="on"`` (its sandbox reaches the internet, and the driver
opens any host) judged by ``llm_judge`` only (see ``judge``). Never run in CI.

* WebVoyager (``data/WebVoyager_data.jsonl``): one object a line with ``id``, ``web_name``,
  ``ques``, ``web``.
* Online-Mind2Web (``Online_Mind2Web.json``): a JSON list of objects with ``task_id``,
  ``confirmed_task``, ``website``, ``level`` (easy, medium, hard), ``reference_length``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchard_async import ConfigError

from .task import TaskLine

JUDGED = [{"type": "llm_judge"}]
FORMATS = ("webvoyager", "mind2web")


def _records(path: Path) -> list[tuple[str, Any]]:
    text = path.read_text()
    if text.lstrip().startswith("["):
        try:
            return [(f"{path.name}[{i}]", record) for i, record in enumerate(json.loads(text))]
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path.name}: not valid JSON ({exc})") from None
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append((f"{path.name}:{number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path.name}:{number}: not valid JSON ({exc})") from None
    return records


def _field(record: Any, name: str, where: str) -> str:
    value = record.get(name) if isinstance(record, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: missing {name!r}")
    return value.strip()


def _url(value: str) -> str:
    return value if value.startswith(("http://", "https://")) else f"https://{value}"


def read_live_tasks(kind: str, path: Path, max_steps: int = 30) -> list[TaskLine]:
    if kind not in FORMATS:
        raise ConfigError(f"unknown live task format {kind!r}; use one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise ConfigError(f"--tasks {kind}:{path}: no such file")
    lines = []
    for where, record in _records(path):
        if kind == "webvoyager":
            line = TaskLine(
                id=_field(record, "id", where),
                site=_field(record, "web_name", where),
                start_url=_url(_field(record, "web", where)),
                intent=_field(record, "ques", where),
                eval=JUDGED,
                max_steps=max_steps,
                network="on",
            )
        else:
            level = record.get("level") if isinstance(record, dict) else None
            line = TaskLine(
                id=_field(record, "task_id", where),
                site=_field(record, "website", where),
                start_url=_url(_field(record, "website", where)),
                intent=_field(record, "confirmed_task", where),
                difficulty=level if level in ("easy", "medium", "hard") else "medium",
                eval=JUDGED,
                max_steps=max_steps,
                network="on",
            )
        lines.append(line)
    return lines

"""Benchmark task files in the GUI task schema: WebVoyager, Online-Mind2Web and DeepShop.

    orchard-async run gui --tasks webvoyager:WebVoyager_data.jsonl --policy openai ...
    orchard-async run gui --tasks mind2web:Online_Mind2Web.json ...
    orchard-async run gui --tasks deepshop:deepshop_test.jsonl ...
    orchard-async run gui --tasks deepshop:builtin --policy oracle      # offline, on the bundled shop

A task on a live site becomes a task with ``network="on"`` (its sandbox reaches the
internet, and the driver opens any host) judged by ``llm_judge`` only (see ``judge``).
Never run in CI.

* WebVoyager (``data/WebVoyager_data.jsonl``): one object a line with ``id``, ``web_name``,
  ``ques``, ``web``.
* Online-Mind2Web (``Online_Mind2Web.json``): a JSON list of objects with ``task_id``,
  ``confirmed_task``, ``website``, ``level`` (easy, medium, hard), ``reference_length``.
* DeepShop (``data/deepshop_test.jsonl``): WebVoyager's fields (``id``, ``web_name``,
  ``ques``, ``web``) plus ``attribute``, ``filter`` and ``sort`` (what the query asks of
  the product, ``"None"`` when nothing), ``category`` and ``difficulty``. A line whose
  ``web`` is a bundled site (``http://127.0.0.1:7101/``, the shop) runs offline on it: it
  must carry our ``eval`` checks (and may carry ``solution``, ``seed``, ``max_steps``), as
  the converted examples in ``tasks/deepshop_shop.jsonl`` (``deepshop:builtin``) do.
"""

from __future__ import annotations

import json
import urllib.parse
from importlib import resources
from pathlib import Path
from typing import Any

from orchard_async import ConfigError
from orchard_async.recipes.gui.lines import SITES, TaskLine, parse_task_line

JUDGED = [{"type": "llm_judge"}]
FORMATS = ("webvoyager", "mind2web", "deepshop")
OFFLINE_FIELDS = ("eval", "solution", "seed", "max_steps")  # what a DeepShop line on a bundled site adds


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


def deepshop_builtin_path() -> Path:
    return Path(str(resources.files(__package__).joinpath("tasks", "deepshop_shop.jsonl")))


def _bundled_site(url: str) -> str | None:
    """The bundled site a URL names (the sandbox's own loopback), or None for a live site."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost"):
        return None
    return next((site for site, port in SITES.items() if parts.port == port), None)


def _deepshop(record: Any, where: str, max_steps: int) -> TaskLine:
    start_url = _url(_field(record, "web", where))
    intent = _field(record, "ques", where)
    level = record.get("difficulty")
    difficulty = level if level in ("easy", "medium", "hard") else "medium"
    site = _bundled_site(start_url)
    if site is None:
        return TaskLine(
            id=_field(record, "id", where),
            site=_field(record, "web_name", where),
            start_url=start_url,
            intent=intent,
            difficulty=difficulty,
            eval=JUDGED,
            max_steps=max_steps,
            network="on",
        )
    if not record.get("eval"):
        raise ConfigError(
            f"{where}: a DeepShop task on the bundled {site} site needs 'eval' checks (it is scored by program)"
        )
    line = {"id": _field(record, "id", where), "site": site, "start_url": start_url, "intent": intent}
    line |= {"difficulty": difficulty} | {key: record[key] for key in OFFLINE_FIELDS if key in record}
    return parse_task_line(json.dumps(line), where)


def read_live_tasks(kind: str, path: Path, max_steps: int = 30) -> list[TaskLine]:
    if kind not in FORMATS:
        raise ConfigError(f"unknown live task format {kind!r}; use one of {', '.join(FORMATS)}")
    if kind == "deepshop" and str(path) == "builtin":
        path = deepshop_builtin_path()
    if not path.is_file():
        raise ConfigError(f"--tasks {kind}:{path}: no such file")
    lines = []
    for where, record in _records(path):
        if kind == "deepshop":
            if not isinstance(record, dict):
                raise ConfigError(f"{where}: a DeepShop task is a JSON object")
            line = _deepshop(record, where, max_steps)
        elif kind == "webvoyager":
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

"""Result rows, machine info, the JSON file, its schema check and the terminal table."""

from __future__ import annotations

import gc
import importlib.metadata
import math
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from orchard_async import loop_choice, percentile
from orchard_async.kit import procfs

# Version 1: `bench exec` of the foundation. Version 2 adds p95/wall/error fields, time
# shares, comparisons, details and the burst/episodes/scale/chaos scenarios; every field
# of version 1 keeps its name and meaning.
RESULT_VERSION = 2


class Row(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One measured subject at one setting. Fields that do not apply stay unset."""

    subject: str  # what was measured: "local", "floor:spawn", "peer:swe-rex", ...
    concurrency: int  # always written, even at 1
    ops: int = 0
    p50_ms: float | None = None
    p90_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    ops_per_s: float | None = None
    operation: str | None = None  # burst: create / exec / destroy / total; episodes: episode
    episodes: int | None = None
    steps: int | None = None
    steps_per_s: float | None = None
    episodes_per_s: float | None = None
    peak_rss_mb: float | None = None
    loop_lag_p99_ms: float | None = None
    success_rate: float | None = None  # 0..1
    errors: int | None = None  # operations that failed
    count: int | None = None  # chaos: episodes or sandboxes in the state named by ``operation``
    wall_s: float | None = None
    time_share: dict[str, float] | None = None  # episodes: fraction of episode time per phase
    extra: dict[str, Any] = {}


class Comparison(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``subject`` against ``baseline`` at one concurrency: >1 means the subject is slower
    (p50/p99 ratios) or faster (throughput ratio)."""

    subject: str
    baseline: str
    concurrency: int
    p50_ratio: float | None = None
    p99_ratio: float | None = None
    ops_ratio: float | None = None


class Result(msgspec.Struct, kw_only=True):
    scenario: str
    adapter: str
    machine: dict[str, Any]
    rows: list[Row]
    version: int = RESULT_VERSION
    started_at: float = 0.0
    wall_s: float = 0.0
    command: str = ""
    lost: int | None = None  # burst, chaos: operations or episodes with no recorded outcome
    leaked: int | None = None  # sandboxes left after the run (and after reap, where it applies)
    comparisons: list[Comparison] = []
    details: dict[str, Any] = {}  # scenario-specific counts (chaos outcomes, leftovers, ...)
    notes: list[str] = []


def ms_percentiles(latencies: Sequence[float]) -> dict[str, float | None]:
    def ms(q: float) -> float | None:
        value = percentile(latencies, q)
        return None if math.isnan(value) else round(value * 1000, 3)

    return {"p50_ms": ms(50), "p90_ms": ms(90), "p95_ms": ms(95), "p99_ms": ms(99)}


def latency_row(subject: str, concurrency: int, latencies: Sequence[float], wall_s: float, **fields: Any) -> Row:
    return Row(
        subject=subject,
        concurrency=concurrency,
        ops=len(latencies),
        ops_per_s=round(len(latencies) / wall_s, 1) if wall_s > 0 else None,
        wall_s=round(wall_s, 3),
        **ms_percentiles(latencies),
        **fields,
    )


def compare_rows(rows: Sequence[Row], subject: str, baseline: str) -> list[Comparison]:
    """Ratios of ``subject`` to ``baseline`` at every concurrency both were measured at."""
    by_level = {row.concurrency: row for row in rows if row.subject == baseline and row.operation is None}
    out = []
    for row in rows:
        base = by_level.get(row.concurrency)
        if row.subject != subject or row.operation is not None or base is None:
            continue
        out.append(
            Comparison(
                subject=subject,
                baseline=baseline,
                concurrency=row.concurrency,
                p50_ratio=_ratio(row.p50_ms, base.p50_ms),
                p99_ratio=_ratio(row.p99_ms, base.p99_ms),
                ops_ratio=_ratio(row.ops_per_s, base.ops_per_s),
            )
        )
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def machine_info() -> dict[str, Any]:
    memory_kib = procfs.memory_total_kib()
    return {
        "cores": os.cpu_count(),
        "memory_gib": None if memory_kib is None else round(memory_kib / 1024**2, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loop": loop_choice(),
        "load_avg_1m": load_average(),
        # the collector's thresholds the run had: the CLI raises the first (orchard_async.engine.collector)
        "gc_threshold": list(gc.get_threshold()),
        "versions": {
            name: _package_version(name)
            for name in ("orchard-async", "anyio", "msgspec", "uvloop", "aiodocker", "kubernetes-asyncio", "swe-rex")
        },
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_json(result: Result, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(result)) + b"\n")


def read_json(path: str | Path) -> Result:
    data = msgspec.json.decode(Path(path).read_bytes())
    for row in data.get("rows", []) if isinstance(data, dict) else []:
        row.setdefault("concurrency", 1)  # version 1 omitted it at its default
    return msgspec.convert(data, Result)


def schema_problems(data: dict[str, Any]) -> list[str]:
    """What is wrong with a result read as plain JSON; empty when it is valid. The contract
    scripts rely on: top level ``version``, ``scenario``, ``adapter``, ``machine``, ``rows``;
    every row a ``subject`` and a ``concurrency``; latency rows ``p50_ms``/``p99_ms``/
    ``ops_per_s``; scale rows ``episodes``/``steps_per_s``/``peak_rss_mb``; burst and chaos
    a top-level ``lost`` and ``leaked``."""
    problems = []
    for key, kind in (("version", int), ("scenario", str), ("adapter", str), ("machine", dict), ("rows", list)):
        if not isinstance(data.get(key), kind):
            problems.append(f"top-level {key!r} missing or not a {kind.__name__}")
    if problems:
        return problems
    for key in ("cores", "python", "loop", "load_avg_1m", "kernel"):
        if key not in data["machine"]:
            problems.append(f"machine.{key} missing")
    if data["scenario"] in ("burst", "chaos"):
        for key in ("lost", "leaked"):
            if not isinstance(data.get(key), int):
                problems.append(f"{data['scenario']}: top-level {key!r} missing or not an integer")
    for index, row in enumerate(data["rows"]):
        where = f"rows[{index}]"
        if not isinstance(row.get("subject"), str) or not isinstance(row.get("concurrency"), int):
            problems.append(f"{where}: subject and concurrency are required")
            continue
        if data["scenario"] == "exec" and row.get("ops"):
            for key in ("p50_ms", "p99_ms", "ops_per_s"):
                if not isinstance(row.get(key), int | float):
                    problems.append(f"{where} ({row['subject']}): {key} missing")
        if data["scenario"] == "scale":
            for key in ("episodes", "steps_per_s", "peak_rss_mb"):
                if not isinstance(row.get(key), int | float):
                    problems.append(f"{where}: scale rows need {key}")
    return problems


COLUMNS = [
    ("subject", "subject"),
    ("operation", "op"),
    ("concurrency", "conc"),
    ("episodes", "episodes"),
    ("ops", "ops"),
    ("p50_ms", "p50 ms"),
    ("p90_ms", "p90 ms"),
    ("p95_ms", "p95 ms"),
    ("p99_ms", "p99 ms"),
    ("ops_per_s", "ops/s"),
    ("steps_per_s", "steps/s"),
    ("episodes_per_s", "eps/s"),
    ("peak_rss_mb", "peak RSS MB"),
    ("loop_lag_p99_ms", "lag p99 ms"),
    ("count", "count"),
    ("success_rate", "success"),
    ("errors", "errors"),
    ("wall_s", "wall s"),
]


def _layout(result: Result) -> dict[str, Any]:
    """What both renderers (terminal, markdown) show, in order."""
    machine = result.machine
    title = (
        f"bench {result.scenario} · adapter {result.adapter} · {machine.get('cores')} cores · "
        f"loop {machine.get('loop')} · load {machine.get('load_avg_1m')}"
    )
    used = [
        (field, name)
        for field, name in COLUMNS
        if field in ("subject", "concurrency", "errors", "count")
        and any(getattr(r, field) is not None for r in result.rows)
        or any(getattr(row, field) for row in result.rows)
    ]
    main = {
        "title": title,
        "headers": [name for _, name in used],
        "rows": [[_cell(field, getattr(row, field)) for field, _ in used] for row in result.rows],
    }
    shares = [row for row in result.rows if row.time_share]
    seen = {phase for row in shares for phase in row.time_share or {}}
    phases = [p for p in _PHASES if p in seen] + sorted(seen - set(_PHASES))
    share = {
        "title": "where episode time goes (share of summed episode time)",
        "headers": ["subject", "conc", *phases],
        "rows": [
            [row.subject, str(row.concurrency), *[f"{(row.time_share or {}).get(p, 0):.1%}" for p in phases]]
            for row in shares
        ],
    }
    comparisons = {
        "title": "ratios (subject / baseline; latency < 1 and throughput > 1 mean the subject is better)",
        "headers": ["subject", "baseline", "conc", "p50 ratio", "p99 ratio", "throughput ratio"],
        "rows": [
            [
                c.subject,
                c.baseline,
                str(c.concurrency),
                _ratio_cell(c.p50_ratio),
                _ratio_cell(c.p99_ratio),
                _ratio_cell(c.ops_ratio),
            ]
            for c in result.comparisons
        ],
    }
    totals = [f"{key}: {getattr(result, key)}" for key in ("lost", "leaked") if getattr(result, key) is not None]
    return {"main": main, "share": share, "comparisons": comparisons, "totals": totals, "notes": result.notes}


def _ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x" if value < 0.1 else f"{value:.2f}x"


def print_result(result: Result, console: Console | None = None) -> None:
    console = console or Console()
    layout = _layout(result)
    for key in ("main", "share", "comparisons"):
        part = layout[key]
        if not part["rows"]:
            continue
        table = Table(title=part["title"])
        for index, header in enumerate(part["headers"]):
            table.add_column(header, justify="left" if index == 0 or header in ("op", "baseline") else "right")
        for cells in part["rows"]:
            table.add_row(*cells)
        console.print(table)
    for line in layout["totals"]:
        value = int(line.split(": ")[1])
        console.print(f"{line.split(':')[0]}: [{'green' if value == 0 else 'bold red'}]{value}[/]")
    for note in layout["notes"]:
        console.print(f"note: {note}")


def to_markdown(result: Result) -> str:
    """The same tables as GitHub markdown, with the command and machine that made them."""
    layout = _layout(result)
    machine = result.machine
    lines = [
        f"`{result.command}`" if result.command else "",
        "",
        f"{machine.get('cores')} cores, {machine.get('memory_gib')} GiB, Linux {machine.get('kernel')}, "
        f"Python {machine.get('python')}, loop {machine.get('loop')}, 1-min load {machine.get('load_avg_1m')} "
        f"→ {machine.get('load_avg_1m_end', '?')}, {machine.get('time', '')}",
        "",
    ]
    for key in ("main", "share", "comparisons"):
        part = layout[key]
        if not part["rows"]:
            continue
        if key != "main":
            lines += [f"*{part['title']}*", ""]
        align = ["---" if i == 0 or h in ("op", "baseline") else "---:" for i, h in enumerate(part["headers"])]
        lines.append("| " + " | ".join(part["headers"]) + " |")
        lines.append("| " + " | ".join(align) + " |")
        lines += ["| " + " | ".join(cells) + " |" for cells in part["rows"]]
        lines.append("")
    if layout["totals"]:
        lines += [", ".join(f"**{line}**" for line in layout["totals"]), ""]
    lines += [f"- {note}" for note in layout["notes"]]
    return "\n".join(lines).strip() + "\n"


_PHASES = ["create", "setup", "agent", "exec", "score", "destroy"]


def _cell(field: str, value: Any) -> str:
    if value is None:
        return "-"
    if field == "success_rate":
        return f"{value:.1%}"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:,.1f}"
    return str(value)

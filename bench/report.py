"""Result rows, machine info, the JSON file and the terminal table of every scenario."""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from orchard_async.runtime import loop_choice
from orchard_async.summary import percentile

RESULT_VERSION = 1


class Row(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One measured subject at one setting. Fields that do not apply stay unset."""

    subject: str  # what was measured: "local", "floor:spawn", "peer:swe-rex", ...
    concurrency: int = 1
    ops: int = 0
    p50_ms: float | None = None
    p90_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    ops_per_s: float | None = None
    operation: str | None = None  # for burst: create / exec / destroy
    episodes: int | None = None
    steps_per_s: float | None = None
    episodes_per_s: float | None = None
    peak_rss_mb: float | None = None
    loop_lag_p99_ms: float | None = None
    success_rate: float | None = None
    extra: dict[str, Any] = {}


class Result(msgspec.Struct, kw_only=True):
    scenario: str
    adapter: str
    machine: dict[str, Any]
    rows: list[Row]
    version: int = RESULT_VERSION
    started_at: float = 0.0
    command: str = ""
    lost: int | None = None
    leaked: int | None = None
    notes: list[str] = []


def latency_row(subject: str, concurrency: int, latencies: list[float], wall_s: float, **fields: Any) -> Row:
    def ms(q: float) -> float | None:
        value = percentile(latencies, q)
        return None if math.isnan(value) else round(value * 1000, 3)

    return Row(
        subject=subject,
        concurrency=concurrency,
        ops=len(latencies),
        p50_ms=ms(50),
        p90_ms=ms(90),
        p95_ms=ms(95),
        p99_ms=ms(99),
        ops_per_s=round(len(latencies) / wall_s, 1) if wall_s > 0 else None,
        **fields,
    )


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    memory_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loop": loop_choice(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
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
    return msgspec.json.decode(Path(path).read_bytes(), type=Result)


COLUMNS = [
    ("subject", "subject"),
    ("operation", "op"),
    ("concurrency", "conc"),
    ("episodes", "episodes"),
    ("ops", "ops"),
    ("p50_ms", "p50 ms"),
    ("p90_ms", "p90 ms"),
    ("p99_ms", "p99 ms"),
    ("ops_per_s", "ops/s"),
    ("steps_per_s", "steps/s"),
    ("episodes_per_s", "eps/s"),
    ("peak_rss_mb", "peak RSS MB"),
    ("loop_lag_p99_ms", "lag p99 ms"),
    ("success_rate", "success"),
]


def print_result(result: Result, console: Console | None = None) -> None:
    console = console or Console()
    used = [(field, title) for field, title in COLUMNS if any(getattr(row, field) not in (None, 0, "") for row in result.rows)]
    table = Table(title=f"bench {result.scenario} · adapter {result.adapter} · {result.machine.get('cores')} cores · loop {result.machine.get('loop')}")
    for _, title in used:
        table.add_column(title, justify="left" if title in ("subject", "op") else "right")
    for row in result.rows:
        table.add_row(*[_cell(getattr(row, field)) for field, _ in used])
    console.print(table)
    for key in ("lost", "leaked"):
        if getattr(result, key) is not None:
            console.print(f"{key}: {getattr(result, key)}")
    for note in result.notes:
        console.print(note)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:,.1f}"
    return str(value)

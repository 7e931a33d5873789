"""`orchard-async bench compare A.json B.json`: B against A, row by row.

Rows are matched by (subject, operation, concurrency). Each metric is shown as A, B and
the ratio B/A; for latencies and memory lower is better, for rates higher is better, and
the ratio is coloured accordingly (beyond +-10%).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from rich.console import Console
from rich.table import Table

from orchard_async import ConfigError
from orchard_async.bench.report import Result, Row, read_json

METRICS = [  # field, title, higher is better
    ("p50_ms", "p50 ms", False),
    ("p99_ms", "p99 ms", False),
    ("ops_per_s", "ops/s", True),
    ("steps_per_s", "steps/s", True),
    ("episodes_per_s", "eps/s", True),
    ("peak_rss_mb", "peak RSS MB", False),
    ("loop_lag_p99_ms", "lag p99 ms", False),
    ("episodes", "count", True),
]


def _key(row: Row) -> tuple[str, str, int]:
    return (row.subject, row.operation or "", row.concurrency)


def ratios(a: Result, b: Result) -> list[dict]:
    """One entry per matched row and metric: {key, metric, a, b, ratio}."""
    left = {_key(row): row for row in a.rows}
    out = []
    for row in b.rows:
        base = left.get(_key(row))
        if base is None:
            continue
        for field, _, _ in METRICS:
            va, vb = getattr(base, field), getattr(row, field)
            if isinstance(va, int | float) and isinstance(vb, int | float):
                out.append(
                    {"key": _key(row), "metric": field, "a": va, "b": vb, "ratio": round(vb / va, 3) if va else None}
                )
    return out


def load_result(path: str | Path) -> Result:
    """A result file written by ``bench ... --json``; anything else is a ConfigError."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not a bench result")
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        data = msgspec.json.decode(path.read_bytes())
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path} is not a bench result (the JSON file of bench --json): {exc}") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows) or "scenario" not in data:
        raise ConfigError(f"{path} is JSON but not a bench result: it needs a 'scenario' and a list of 'rows'")
    try:
        return read_json(path)
    except (msgspec.DecodeError, ValueError, TypeError) as exc:  # a field of the wrong type
        raise ConfigError(f"{path} is not a bench result: {exc}") from None


def compare(path_a: str | Path, path_b: str | Path, console: Console | None = None) -> int:
    console = console or Console()
    a, b = load_result(path_a), load_result(path_b)
    if a.scenario != b.scenario:
        console.print(f"[yellow]warning:[/] comparing different scenarios ({a.scenario} vs {b.scenario})")
    entries = ratios(a, b)
    fields = [m for m in METRICS if any(e["metric"] == m[0] for e in entries)]
    table = Table(
        title=f"B/A · A={path_a} ({a.adapter}, load {a.machine.get('load_avg_1m')}) · B={path_b} ({b.adapter}, load {b.machine.get('load_avg_1m')})"
    )
    table.add_column("subject")
    table.add_column("op")
    table.add_column("conc", justify="right")
    for _, title, _ in fields:
        table.add_column(f"{title} A → B", justify="right")
    by_key: dict[tuple, dict[str, dict]] = {}
    for entry in entries:
        by_key.setdefault(entry["key"], {})[entry["metric"]] = entry
    for key, metrics in by_key.items():
        cells = []
        for field, _, higher_better in fields:
            entry = metrics.get(field)
            cells.append(_cell(entry, higher_better) if entry else "-")
        table.add_row(key[0], key[1] or "-", str(key[2]), *cells)
    console.print(table)
    unmatched = len(b.rows) - len(by_key)
    if unmatched:
        console.print(f"{unmatched} row(s) of B have no match in A")
    for name in ("lost", "leaked"):
        va, vb = getattr(a, name), getattr(b, name)
        if va is not None or vb is not None:
            console.print(f"{name}: {va} → {vb}")
    return 0


def _cell(entry: dict, higher_better: bool) -> str:
    ratio = entry["ratio"]
    text = f"{_num(entry['a'])} → {_num(entry['b'])}"
    if ratio is None:
        return text
    better = ratio > 1.1 if higher_better else ratio < 0.9
    worse = ratio < 0.9 if higher_better else ratio > 1.1
    style = "green" if better else "red" if worse else ""
    ratio_text = f"{ratio:.2f}x"
    return f"{text} [{style}]({ratio_text})[/]" if style else f"{text} ({ratio_text})"


def _num(value: float) -> str:
    return (
        f"{value:.3f}"
        if isinstance(value, float) and value < 10
        else f"{value:,.1f}"
        if isinstance(value, float)
        else str(value)
    )

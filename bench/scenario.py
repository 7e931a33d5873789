"""What a scenario hands back to the CLI, which adds the run's metadata and prints it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchard_async.bench.report import Comparison, Row


@dataclass
class Outcome:
    rows: list[Row] = field(default_factory=list)
    lost: int | None = None
    leaked: int | None = None
    comparisons: list[Comparison] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

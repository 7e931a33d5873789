"""``orchard-async bench service``: every way measured in one run, through a real service."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard_async.apps import cli

WAYS = {"in-process", "in-process, Orchard's bash -c", "service, Orchard HTTP", "remote adapter (native)"}


def test_bench_service_measures_each_way_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "service.json"
    argv = ["bench", "service", "--levels", "1/1,2/1", "--ops", "8", "--creates", "2", "--json", str(out)]
    assert cli.main(argv) == 0
    result = json.loads(out.read_text())
    rows = {(row["way"], row["callers"]): row for row in result["exec"]}
    assert set(rows) == {(way, callers) for way in WAYS for callers in (1, 2)}
    assert all(row["ops"] == 8 and 0 < row["p50_ms"] <= row["p99_ms"] for row in rows.values())
    for way in ("in-process", "remote adapter"):
        assert result["create_delete"][way]["per_s"] > 0
    assert "| service, Orchard HTTP | 1 / 1 | 8 |" in capsys.readouterr().out


def test_bench_service_rejects_bad_options_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "service", "--adapter-options", "[1]"]) == 2
    assert "--adapter-options must be a JSON object" in capsys.readouterr().err

"""Run `orchard-async bench ...` in this process and read back its JSON result.

Every run gets a private root for local sandboxes (ORCHARD_LOCAL_ROOT), so the reap a
scenario ends with never touches sandboxes of anything else running on the machine."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchard_async.apps.cli import main
from orchard_async.bench.report import schema_problems

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@pytest.fixture
def bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., dict[str, Any]]:
    root = tmp_path / "sandboxes"
    monkeypatch.setenv("ORCHARD_LOCAL_ROOT", str(root))
    counter = iter(range(1000))

    def run(*argv: str, expect_exit: int = 0, plot: bool = True) -> dict[str, Any]:
        number = next(counter)
        out = tmp_path / f"result{number}.json"
        args = ["bench", *argv, "--json", str(out)]
        png = tmp_path / f"plot{number}.png"
        if plot and HAVE_MATPLOTLIB:
            args += ["--plot", str(png)]
        code = main(args)
        assert code == expect_exit, f"exit code {code} for {args}"
        data = json.loads(out.read_text())
        assert schema_problems(data) == []
        assert data["scenario"] == argv[0]
        if plot and HAVE_MATPLOTLIB:
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        data["_json_path"] = str(out)
        # Nothing of any sandbox is left in the private root.
        assert not root.exists() or list(root.iterdir()) == []
        return data

    return run

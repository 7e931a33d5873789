"""Harbor's own runner (`harbor run`, the real package) over ``orchard_async.harbor``: its
oracle agent resolves the fixture set, its nop agent nothing. Harbor needs Python 3.12, so it
runs from a venv of its own: ``ORCHARD_HARBOR_VENV`` (.ci/run makes it), with this checkout
installed there as `pip install -e '.[harbor]'`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import backend_missing
from tests.harbor.support import IMAGE_MAP, TASKS, ready

PROVIDER = "orchard_async.harbor:OrchardEnvironment"
# Tasks Harbor's oracle cannot resolve over the provider: none (its sandboxes may switch users).
UNRESOLVED: dict[str, set[str]] = {"docker": set(), "local": set()}


def harbor_cli() -> Path:
    venv = os.environ.get("ORCHARD_HARBOR_VENV")
    harbor = Path(venv or "/nonexistent") / "bin" / "harbor"
    if not harbor.is_file():
        backend_missing(
            "Harbor's runner needs a Python 3.12 venv in ORCHARD_HARBOR_VENV with "
            "`pip install -e '.[harbor]'` (.ci/run makes one)"
        )
    return harbor


def harbor_run(agent: str, adapter: str, jobs: Path) -> dict[str, dict]:
    command = [
        str(harbor_cli()), "run", "-y", "-p", str(TASKS), "-a", agent, "-e", PROVIDER, "--ek", f"adapter={adapter}",
        "--ek", f"image_map={json.dumps(IMAGE_MAP)}", "-o", str(jobs), "-n", "4",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False,
                          env={**os.environ, "HARBOR_TELEMETRY": "0"})  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    trials = {}
    for result in jobs.glob("*/*/result.json"):
        data = json.loads(result.read_text())
        trials[data["task_name"].split("/")[-1]] = data
    return trials


@pytest.mark.soak
@pytest.mark.parametrize("adapter", ["local", "docker"])
def test_harbor_oracle_resolves_and_nop_does_not(adapter, tmp_path):
    ready(adapter)
    oracle = harbor_run("oracle", adapter, tmp_path / "oracle")
    nop = harbor_run("nop", adapter, tmp_path / "nop")
    assert set(oracle) == set(nop) == {p.name for p in TASKS.iterdir() if p.is_dir()}
    resolved = {
        name for name, t in oracle.items() if ((t.get("verifier_result") or {}).get("rewards") or {}).get("reward") == 1
    }
    assert resolved == set(oracle) - UNRESOLVED[adapter], {n: t.get("exception_info") for n, t in oracle.items()}
    assert not [n for n, t in nop.items() if ((t.get("verifier_result") or {}).get("rewards") or {}).get("reward")]

"""The user's path: the README's first command in a bare venv, without the dev extra.

`pip install -e . && orchard-async demo` must resolve every oracle episode. The venv is not
first on PATH (as when a user calls it by its path or from a script), so nothing the test
process or the dev extra has can stand in for what the plain install must bring.

CI builds the venv before the test namespaces start (they have no route to PyPI) and names
it in ORCHARD_FRESH_VENV; elsewhere this test builds its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import backend_missing

REPO = Path(__file__).resolve().parents[1]
BARE_PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    given = os.environ.get("ORCHARD_FRESH_VENV")
    if given:
        venv = Path(given)
        if not (venv / "bin" / "orchard-async").exists():
            pytest.fail(f"ORCHARD_FRESH_VENV={given} has no orchard-async: `pip install -e .` did not run there")
        return venv
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "-e", str(REPO)], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        backend_missing(f"could not install into a fresh venv (no package index?): {done.stderr.strip()[-300:]}")
    return venv


def test_readme_first_command_resolves_every_oracle_episode(fresh_venv: Path, tmp_path: Path) -> None:
    pip_list = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-m", "pip", "list", "--format=json"], capture_output=True, text=True
    )
    installed = {p["name"].lower() for p in json.loads(pip_list.stdout)}
    assert "hypothesis" not in installed and "pytest-asyncio" not in installed, "the dev extra is in the bare venv"

    env = {
        "PATH": BARE_PATH,
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "ORCHARD_LOCAL_ROOT": str(tmp_path / "sandboxes"),
    }
    cli = str(fresh_venv / "bin" / "orchard-async")
    demo = subprocess.run(
        [cli, "demo", "--out", "out"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    inspect = subprocess.run(
        [cli, "inspect", "out/trajectories.jsonl", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    summary = json.loads(inspect.stdout)
    assert summary["episodes"] == 32 and summary["success_rate"] == 1.0, summary
    assert summary["verifier_errors"] == 0 and summary["retries"] == 0
    left = list((tmp_path / "sandboxes").iterdir()) if (tmp_path / "sandboxes").exists() else []
    assert left == []


# Where each module would be loaded from (find_spec: an optional extra the bare venv lacks,
# such as aiodocker, does not stop the look-up of a module that needs it).
SUBPACKAGES = """
import importlib, importlib.util, json, pkgutil
import orchard_async
names = ["orchard_async"]
for info in pkgutil.walk_packages(orchard_async.__path__, "orchard_async.", onerror=lambda name: None):
    names.append(info.name)
for top in ("adapters", "recipes", "bench"):
    package = importlib.import_module(f"orchard_async.{top}")
    names.append(package.__name__)
    names += [i.name for i in pkgutil.walk_packages(package.__path__, f"orchard_async.{top}.", onerror=lambda n: None)]
print(json.dumps({name: importlib.util.find_spec(name).origin for name in names}))
"""


def test_a_checkout_imports_every_module_from_itself(fresh_venv: Path, tmp_path: Path) -> None:
    """The venv's editable install maps orchard_async to REPO; a second clone, run from its
    root, still imports every orchard_async.* module (adapters, recipes, bench included) from
    that clone, not from the checkout the venv was made from."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    done = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-c", SUBPACKAGES],
        cwd=clone,
        env={"PATH": BARE_PATH, "HOME": str(tmp_path), "LANG": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    files = json.loads(done.stdout)
    assert {"orchard_async.adapters.local", "orchard_async.recipes.swe", "orchard_async.bench.cli"} <= set(files)
    outside = {name: path for name, path in files.items() if not Path(path).resolve().is_relative_to(clone.resolve())}
    assert outside == {}

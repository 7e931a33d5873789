"""Harbor's own runner (`harbor run`, the real package) over ``orchard_async.harbor``: its
oracle agent resolves the fixture set, its nop agent nothing. Harbor needs Python 3.12, so it
runs from a venv of its own: ``ORCHARD_HARBOR_VENV`` (.ci/run makes it), with this checkout
installed there as `pip install -e '.[harbor,kubernetes]'`.

On kubernetes (CI's cluster run) the provider builds each Dockerfile task's image with docker
and imports it, and the images the others name, into the one-node cluster's containerd
itself: the fixtures are copied with a new line in each Dockerfile, so no earlier build or
import can stand in."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from orchard_async.recipes.harbor import images
from tests.conftest import backend_missing, cluster_configured, require_docker
from tests.harbor.support import IMAGE_MAP, TASKS, TEST_IMAGE, fixture_server, load, ready

PROVIDER = "orchard_async.harbor:OrchardEnvironment"


def harbor_cli() -> Path:
    venv = os.environ.get("ORCHARD_HARBOR_VENV")
    harbor = Path(venv or "/nonexistent") / "bin" / "harbor"
    if not harbor.is_file():
        backend_missing(
            "Harbor's runner needs a Python 3.12 venv in ORCHARD_HARBOR_VENV with "
            "`pip install -e '.[harbor,kubernetes]'` (.ci/run makes one)"
        )
    return harbor


def harbor_run(agent: str, adapter: str, jobs: Path, tasks: Path = TASKS) -> dict[str, dict]:
    command = [
        str(harbor_cli()), "run", "-y", "-p", str(tasks), "-a", agent, "-e", PROVIDER, "--ek", f"adapter={adapter}",
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


def fresh_fixtures(target: Path) -> Path:
    """The fixtures, each Dockerfile with a line of its own: images no build made before."""
    shutil.copytree(TASKS, target)
    mark = uuid.uuid4().hex[:12]
    for dockerfile in target.glob("*/environment/Dockerfile"):
        dockerfile.write_text(dockerfile.read_text() + f"LABEL orchard.test.run={mark}\n")
    return target


@pytest.mark.soak
@pytest.mark.parametrize("adapter", ["local", "docker", "kubernetes"])
def test_harbor_oracle_resolves_and_nop_does_not(adapter, tmp_path):
    tasks = TASKS
    if adapter == "kubernetes":  # the provider builds and imports (no `harbor build` first)
        if not cluster_configured():
            backend_missing("no Kubernetes cluster configured (KUBECONFIG, ~/.kube/config or ORCHARD_K8S_TEST_CONTEXT)")
        require_docker(TEST_IMAGE)
        tasks = fresh_fixtures(tmp_path / "tasks")
    else:
        ready(adapter)
    built = [t.built_image for t in load(tasks) if t.built_image]
    try:
        with fixture_server():  # what the no-network task must not reach
            oracle = harbor_run("oracle", adapter, tmp_path / "oracle", tasks)
            nop = harbor_run("nop", adapter, tmp_path / "nop", tasks)
        if adapter == "kubernetes":
            refs = images.containerd_refs(images.cluster_containerd())
            assert built and all(images.in_containerd(tag, refs) for tag in built), (built, refs)
    finally:
        if adapter == "kubernetes":
            subprocess.run(["docker", "rmi", "-f", *built], capture_output=True, check=False)
    assert set(oracle) == set(nop) == {p.name for p in TASKS.iterdir() if p.is_dir()}
    resolved = {
        name for name, t in oracle.items() if ((t.get("verifier_result") or {}).get("rewards") or {}).get("reward") == 1
    }
    assert resolved == set(oracle), {n: t.get("exception_info") for n, t in oracle.items()}
    assert not [n for n, t in nop.items() if ((t.get("verifier_result") or {}).get("rewards") or {}).get("reward")]

"""The same smoke tests on docker, when a daemon answers (run by default where docker is up,
and in CI, which starts it; ORCHARD_TEST_BACKENDS=local skips them). Small: a few containers."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import require_docker

IMAGE = os.environ.get("ORCHARD_DOCKER_TEST_IMAGE", "orchard/busybox:test")
OPTIONS = json.dumps({"image": IMAGE})


@pytest.fixture(autouse=True)
def docker_available() -> None:
    selected = os.environ.get("ORCHARD_TEST_BACKENDS")
    if selected is not None and "docker" not in selected.split(","):
        pytest.skip("docker not in ORCHARD_TEST_BACKENDS")
    require_docker(IMAGE)


def test_exec_docker_with_floors(bench) -> None:
    data = bench(
        "exec", "--adapter", "docker", "--adapter-options", OPTIONS, "--concurrency", "1,2", "--ops", "6", plot=False
    )
    assert data["leaked"] == 0
    subjects = {row["subject"] for row in data["rows"]}
    assert "docker" in subjects
    # Both floors run where the CLI and aiodocker exist; otherwise a note says why not.
    for floor in ("floor:docker-exec", "floor:aiodocker-exec"):
        assert floor in subjects or any(note.startswith(f"{floor} skipped") for note in data["notes"])
    for row in data["rows"]:
        assert row["ops"] >= row["concurrency"] and row["p50_ms"] > 0
        assert row.get("errors", 0) == 0


def test_burst_docker(bench) -> None:
    data = bench("burst", "--adapter", "docker", "--adapter-options", OPTIONS, "-n", "3", "-k", "2", plot=False)
    assert data["lost"] == 0 and data["leaked"] == 0
    by_op = {row["operation"]: row for row in data["rows"]}
    assert by_op["create"]["ops"] == 3 and by_op["exec"]["ops"] == 6 and by_op["destroy"]["ops"] == 3
    assert by_op["total"]["success_rate"] == 1.0


# Whole recipes (or floors) on docker, 20-50 s each: left to `pytest -m soak` so the default run stays
# under 5 minutes on 2 cores; CI runs both.
pytestmark = pytest.mark.soak

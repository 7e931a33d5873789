"""Shared test helpers. A backend that is not available skips its tests with the reason,
except in CI (CI=true), where a missing backend is a failure: skipping is for users' machines."""

from __future__ import annotations

import os

import pytest


def backend_missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"backend required in CI is unavailable: {reason}")
    pytest.skip(reason)


def cluster_configured() -> bool:
    """Kubernetes tests run where a cluster is configured; CI configures one when it starts it."""
    if os.environ.get("ORCHARD_K8S_TEST_CONTEXT"):
        return True
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    return os.path.exists(path)


# -- running in parallel ---------------------------------------------------------------------
# `python -m pytest` runs on several workers (pytest-xdist, `-n` in pyproject's addopts). Tests of
# one group run one after another on one worker. Everything that drives the Docker daemon is one
# group (one test restarts the daemon; others count its containers), everything that drives the
# cluster another (one test restarts the API server); the rest is grouped by file, so a module's
# fixtures are built once, and the files sharing the bundled SWE set's session fixture go together.
# (A scheduler of our own: xdist's `loadgroup` marks do not reach the scheduler under pytest 9.)
SHARED_SESSION_FIXTURE_FILES = {
    "tests/recipes/test_swe_builtin_data.py": "swe-builtin",
    "tests/recipes/test_swe_recipe.py": "swe-builtin",
    "tests/recipes/test_swe_parity.py": "swe-builtin",
}
DOCKER_FILES = {
    "tests/adapters/test_docker.py",
    "tests/bench/test_docker.py",
    "tests/recipes/test_claw_docker.py",
    "tests/recipes/test_gui_docker.py",
    "tests/recipes/test_swe_docker.py",
    "tests/recipes/test_swe_real_instances.py",
}


def group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    params = set(nodeid.partition("[")[2].rstrip("]").split("-"))  # conformance: the backend's name
    if path in DOCKER_FILES or "docker" in params:
        return "docker"
    if path == "tests/adapters/test_kubernetes.py" or "kubernetes" in params:
        return "kubernetes"
    return SHARED_SESSION_FIXTURE_FILES.get(path, path)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByBackend(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByBackend(config, log)

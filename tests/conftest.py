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

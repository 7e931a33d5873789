"""The kubernetes adapter's guardian without a cluster: which pods of a dead controller it
deletes, and that its waiting stage hands over to the acting one only when the controller's
pipe closes with nothing written (the adapter's clean close writes a byte)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("kubernetes_asyncio")

from orchard_async.adapters.kubernetes import guardian  # noqa: E402
from orchard_async.kit import labels as names  # noqa: E402


def pod(name: str, phase: str = "Running", *, reattach: bool = False, deleting: bool = False) -> dict:
    metadata: dict = {"name": name, "labels": {names.REATTACH: "60"} if reattach else {}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    return {"metadata": metadata, "status": {"phase": phase}}


def test_a_dead_controllers_pods_are_deleted_but_a_running_one_with_a_grace() -> None:
    pods = [
        pod("running"),
        pod("pending", "Pending"),
        pod("ended", "Failed"),
        pod("in-its-grace", reattach=True),
        pod("grace-over", "Failed", reattach=True),
        pod("already-going", deleting=True),
        pod("sent-before"),
    ]
    assert guardian.doomed(pods, {"sent-before"}) == ["running", "pending", "ended", "grace-over"]


def wait_stage(tmp_path: Path, written: bytes) -> bool:
    """Run the waiting stage with an acting stage that leaves a mark; whether it acted."""
    mark = tmp_path / "acted"
    argv = [sys.executable, "-I", "-S", "-c", guardian.WAIT, "/bin/sh", "-c", f"touch {mark}"]
    subprocess.run(argv, input=written, check=True, timeout=30)
    return mark.exists()


def test_the_guardian_acts_when_its_controller_dies_and_not_after_a_clean_close(tmp_path: Path) -> None:
    assert wait_stage(tmp_path, b"closed") is False
    assert wait_stage(tmp_path, b"") is True

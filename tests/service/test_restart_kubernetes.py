"""The restart of test_restart.py on kubernetes: a service killed with ``kill -9`` and started
again takes its sandbox pods back (same ids, same files), and removes them on a clean stop."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async.apps.serve.app import b64decode, b64encode
from tests.conftest import backend_missing, cluster_configured
from tests.service.test_restart import Serve, make, run

IMAGE = os.environ.get("ORCHARD_K8S_TEST_IMAGE", "local/busybox:1")
NAMESPACE = os.environ.get("ORCHARD_K8S_TEST_NAMESPACE", "orchard-test")
CONTEXT = os.environ.get("ORCHARD_K8S_TEST_CONTEXT")
OPTIONS = {"image": IMAGE, "namespace": NAMESPACE, **({"context": CONTEXT} if CONTEXT else {})}


def pods_of(name: str) -> dict[str, dict[str, str]]:
    """The sandbox pods (running or not yet deleted) of the service called ``name``."""

    async def find() -> dict[str, dict[str, str]]:
        adapter = oa.get_adapter("kubernetes", **OPTIONS)
        try:
            return await adapter.find_sandboxes({"orchard.serve.name": name})
        finally:
            await adapter.close()

    return anyio.run(find)


@pytest.fixture
def service_name() -> Iterator[str]:
    if not cluster_configured():
        pytest.skip("no Kubernetes cluster configured (KUBECONFIG, ~/.kube/config or ORCHARD_K8S_TEST_CONTEXT)")
    try:
        anyio.run(oa.get_adapter("kubernetes", **OPTIONS).doctor)
    except oa.OrchardError as exc:
        backend_missing(f"kubernetes: {exc}")
    name = f"test-restart-{uuid.uuid4().hex[:10]}"
    yield name

    async def remove_left() -> None:  # what a failed test left: only this service's pods
        adapter = oa.get_adapter("kubernetes", **OPTIONS)
        try:
            for pod in await adapter.find_sandboxes({"orchard.serve.name": name}):
                await adapter._remove(pod, True)
        finally:
            await adapter.close()

    anyio.run(remove_left)


def test_a_killed_service_restarted_serves_the_same_pods(tmp_path: Path, service_name: str) -> None:
    options = ["--adapter-options", json.dumps(OPTIONS)]
    first = Serve(tmp_path, service_name, *options, adapter="kubernetes")
    try:
        with first.client("") as http:
            kept = make(http, image=IMAGE, sandbox_id="pod-box")
            payload = bytes(range(256))
            uploaded = http.post(
                f"/sandboxes/{kept}/files", json={"path": "/workspace/kept.bin", "content": b64encode(payload)}
            )
            assert uploaded.status_code == 200, uploaded.text
    finally:
        first.kill()
    second = Serve(tmp_path, service_name, *options, adapter="kubernetes")
    try:
        with second.client("") as http:
            got = http.get(f"/sandboxes/{kept}/wait", params={"timeout": 120})
            assert got.status_code == 200 and got.json()["ready"] is True, got.text
            got = http.get(f"/sandboxes/{kept}/files", params={"path": "/workspace/kept.bin"})
            assert got.status_code == 200, got.text
            assert b64decode(got.json()["content"], "content") == payload
            assert run(http, kept, "echo again")["stdout"] == "again\n"
            assert [box["sandbox_id"] for box in http.get("/sandboxes").json()["sandboxes"]] == [kept]
    finally:
        second.stop()
    assert second.process.returncode == 0, second.log.read_text()[-2000:]
    deadline = time.monotonic() + 60  # deleted pods are listed until the kubelet has stopped them
    while pods_of(service_name) and time.monotonic() < deadline:
        time.sleep(1)
    assert pods_of(service_name) == {}

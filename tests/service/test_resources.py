"""``GET /resources``: what the asking key can still create, by the service's quotas and the
backend's capacity."""

from __future__ import annotations

import os

import pytest

from orchard_async.apps.serve.resources import quantity
from tests.conftest import backend_missing, docker_unready
from tests.service.conftest import KEY_A, KEY_B, TEST_IMAGE, Service, make_sandbox


async def test_the_quotas_room_for_the_asking_key(start_service) -> None:
    service: Service = await start_service(
        "sim", keys=True, quotas={"max_sandboxes": 3, "creates_per_minute": 4}, max_sandboxes=5
    )
    async with service.client(KEY_A) as a, service.client(KEY_B) as b:
        assert (await a.get("/resources")).json()["can_create"] == 3
        for _ in range(2):
            await make_sandbox(a)
        await make_sandbox(b)
        answer = (await a.get("/resources")).json()
        assert answer["status"] == "ok"
        assert answer["service"] == {"max_sandboxes": 5, "live": 3, "free": 2}
        assert answer["key"] == {
            "name": "team-a",
            "max_sandboxes": 3,
            "live": 2,
            "free": 1,
            "creates_per_minute": 4,
            "creates_left_this_minute": 2,
        }
        assert answer["can_create"] == 1 and answer["backend"] == {"kind": "sim"}
        await make_sandbox(a)
        assert (await a.get("/resources")).json()["can_create"] == 0  # the key's quota is used
        other = (await b.get("/resources")).json()
        assert (other["key"]["name"], other["key"]["live"], other["can_create"]) == ("team-b", 1, 1)  # the service's
        assert (await a.post("/sandboxes", json={"image": "x", "block_network": True})).status_code == 503
        assert (await a.get("/resources", headers={"X-API-Key": "wrong-key-xyz"})).status_code == 403


async def test_the_local_backend_reports_this_machine(start_service) -> None:
    service: Service = await start_service("local")
    async with service.client() as http:
        backend = (await http.get("/resources")).json()["backend"]
    assert backend["kind"] == "local" and backend["cpus"] == os.cpu_count()
    assert 0 < backend["memory_available_bytes"] <= backend["memory_bytes"]


@pytest.mark.soak
async def test_the_docker_backend_reports_the_daemon(start_service) -> None:
    if reason := await docker_unready(TEST_IMAGE):
        backend_missing(reason)
    service: Service = await start_service("docker")
    async with service.client() as http:
        backend = (await http.get("/resources")).json()["backend"]
    assert backend["kind"] == "docker" and "error" not in backend, backend
    assert backend["cpus"] >= 1 and backend["memory_bytes"] > 0 and backend["containers_running"] >= 0


def test_kubernetes_quantities() -> None:
    assert [quantity(text) for text in ("500m", "4", "16Gi", "1k", "2M", "0.5")] == [
        0.5,
        4.0,
        16 * 2**30,
        1000.0,
        2e6,
        0.5,
    ]

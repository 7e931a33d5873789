"""The client's retries never run a command twice (orchard-env-api.md sections 1 and 4).

Orchard's client re-POSTs ``/exec``: the same body after a broken connection, the same body
without ``"wait"`` after any other failure. Each test counts how often the command really
ran, with a line it appends to a file."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

import orchard_async.apps.serve.jobs as jobs_module
from tests.service.conftest import Service, make_sandbox
from tests.service.test_contract import exec_body

COUNTED = "echo ran >> runs.txt"


async def runs(http: httpx.AsyncClient, sandbox_id: str) -> int:
    job = (await http.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("cat runs.txt 2>/dev/null | wc -l"))).json()
    return int(job["stdout"].strip())


async def post_and_hang_up(service: Service, path: str, body: dict[str, Any]) -> None:
    """Send a POST and close the connection without reading the answer: a dropped connection."""
    host, port = service.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(body).encode()
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    await asyncio.sleep(0.3)  # the service has read it and started the command
    writer.close()
    await writer.wait_closed()


async def test_fallback_post_without_wait_gets_the_first_job(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    first = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body(COUNTED))).json()
    fallback_body = exec_body(COUNTED)
    del fallback_body["wait"]  # the SDK's fallback request
    fallback = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=fallback_body)).json()
    assert fallback["job_id"] == first["job_id"] and fallback["status"] == "succeeded"
    assert await runs(client, sandbox_id) == 1
    # A command sent again on purpose (with wait, its earlier answer delivered) runs again.
    await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body(COUNTED))
    assert await runs(client, sandbox_id) == 2


async def test_retry_after_a_dropped_connection_gets_the_running_job(service: Service) -> None:
    async with service.client() as http:
        sandbox_id = await make_sandbox(http)
        body = exec_body(f"sleep 2; {COUNTED}")
        await post_and_hang_up(service, f"/sandboxes/{sandbox_id}/exec", body)
        retried = (await http.post(f"/sandboxes/{sandbox_id}/exec", json=body)).json()
        assert retried["status"] == "succeeded"
        assert await runs(http, sandbox_id) == 1
        # Its answer was delivered this time: the same body again is a new command.
        again = (await http.post(f"/sandboxes/{sandbox_id}/exec", json=body)).json()
        assert again["job_id"] != retried["job_id"]
        assert await runs(http, sandbox_id) == 2


async def test_the_sdks_fallback_after_a_dropped_connection(service: Service) -> None:
    """The connection breaks, the retry gets an error, the SDK falls back to no-wait: one run."""
    async with service.client() as http:
        sandbox_id = await make_sandbox(http)
        body = exec_body(f"sleep 1; {COUNTED}")
        await post_and_hang_up(service, f"/sandboxes/{sandbox_id}/exec", body)
        del body["wait"]
        fallback = (await http.post(f"/sandboxes/{sandbox_id}/exec", json=body)).json()
        job = fallback
        while job["status"] not in ("succeeded", "failed"):
            job = (await http.get(f"/jobs/{fallback['job_id']}")).json()
        assert job["status"] == "succeeded"
        assert await runs(http, sandbox_id) == 1


async def test_idempotency_key(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    headers = {"Idempotency-Key": "call-1"}
    first = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body(COUNTED), headers=headers)).json()
    second = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body(COUNTED), headers=headers)).json()
    assert first["job_id"] == second["job_id"]
    assert await runs(client, sandbox_id) == 1


async def test_wait_answers_in_time_with_a_job_id_to_poll(client: httpx.AsyncClient, monkeypatch) -> None:
    """A command queued behind another is answered within its timeout + the margin, as not
    finished, with its job id: the client polls instead of POSTing again."""
    monkeypatch.setattr(jobs_module, "WAIT_MARGIN", 0.0)
    sandbox_id = await make_sandbox(client)
    await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("sleep 3", wait=False))
    queued = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body(COUNTED, timeout_seconds=1))).json()
    assert queued["status"] in ("queued", "running") and queued["job_id"]
    job = queued
    while job["status"] not in ("succeeded", "failed"):
        job = (await client.get(f"/jobs/{queued['job_id']}")).json()
    assert job["status"] == "succeeded"
    assert await runs(client, sandbox_id) == 1


async def test_create_retried_with_the_same_id_gets_the_same_sandbox(client: httpx.AsyncClient) -> None:
    body = {"image": "orchard/busybox:test", "block_network": True, "sandbox_id": "mine-1"}
    first = (await client.post("/sandboxes", json=body)).json()
    second = await client.post("/sandboxes", json=body)
    assert second.status_code == 200 and second.json()["created_at"] == first["created_at"]
    conflict = await client.post("/sandboxes", json={**body, "timeout": 60})
    assert conflict.status_code == 409 and "already exists" in conflict.json()["detail"]
    listed = (await client.get("/sandboxes")).json()["sandboxes"]
    assert [box["sandbox_id"] for box in listed] == ["mine-1"]


class _Gone:
    """A connection whose caller hung up."""

    def is_closing(self) -> bool:
        return True


async def test_create_retried_after_a_hang_up_gets_the_same_sandbox(service: Service) -> None:
    from orchard_async.apps.serve.app import REGISTRY
    from orchard_async.apps.serve.keys import ANONYMOUS
    from orchard_async.apps.serve.schema import CreateRequest

    registry = service.app[REGISTRY]
    request = CreateRequest(image="orchard/busybox:test")
    first = registry.create(ANONYMOUS, request, _Gone())
    assert registry.create(ANONYMOUS, request, None) is first  # the retry: its original was never answered
    registry.answered(first)
    assert registry.create(ANONYMOUS, request, None) is not first  # answered: a new create is a new sandbox

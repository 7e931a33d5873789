"""Orchard Env's client flows against the service, with a client that follows the contract
file's request shapes exactly (orchard_sdk.py; the real package is not on PyPI): create
with and without a caller's id, wait, exec, job polling, timeouts, uploads of all 256 byte
values, downloads, list, apply_patch clean and conflicting, delete then 404."""

from __future__ import annotations

import anyio
import pytest
import requests

import orchard_async.apps.serve.jobs as jobs_module
from tests.service.conftest import KEY_A, Service
from tests.service.orchard_sdk import AsyncSandboxClient, SandboxClient

IMAGE = "orchard/busybox:test"
PATCH = "--- a/mod.txt\n+++ b/mod.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
EVERY_BYTE = bytes(range(256))


def sync_flow(url: str, key: str | None) -> None:
    client = SandboxClient(url, api_key=key, sandbox_prefix="p")
    assert isinstance(client.health(), dict)
    sandbox = client.create_sandbox(IMAGE, sandbox_id="flow1", timeout=600)
    assert sandbox.id == "p-flow1"
    generated = client.create_sandbox(IMAGE)
    assert generated.id.startswith("p-") and len(generated.id) == len("p-") + 8
    job = sandbox.exec("echo hello; echo oops >&2; exit 2")
    assert (job.status, job.exit_code, job.stdout, job.stderr, job.succeeded) == (
        "failed",
        2,
        "hello\n",
        "oops\n",
        False,
    )
    assert sandbox.exec(["echo", "listed"]).stdout == "listed\n"
    timed_out = sandbox.exec("sleep 30", timeout=1)
    assert (timed_out.exit_code, timed_out.status) == (124, "failed")
    assert sandbox.exec("pwd", cwd="/workspace/none").stdout == "/\n"
    sandbox.upload_content(EVERY_BYTE, "/workspace/bytes.bin")
    assert sandbox.download_content("/workspace/bytes.bin") == EVERY_BYTE
    sandbox.upload_content(b"one\ntwo\nthree\n", "/workspace/mod.txt")
    names = {entry["name"]: entry["type"] for entry in sandbox.list_files("/workspace")}
    assert names["bytes.bin"] == "file" and names["mod.txt"] == "file"
    assert sandbox.apply_patch(PATCH)["success"] is True
    assert sandbox.download_content("/workspace/mod.txt") == b"one\nTWO\nthree\n"
    conflicting = sandbox.apply_patch(PATCH)
    assert conflicting["success"] is False and conflicting["exit_code"] != 0
    sandbox.heartbeat()
    job_again = client.get_job(job.job_id)
    assert job_again.job_id == job.job_id and job_again.stdout == "hello\n"
    assert sandbox.delete()["status"] == "deleted"
    assert generated.delete()["status"] == "deleted"
    with pytest.raises(requests.HTTPError) as gone:
        client.get_sandbox(sandbox.id)
    assert gone.value.response.status_code == 404
    # Every exec was one POST: nothing fell back, nothing ran twice.
    assert [path for method, path in client.calls if path.endswith("/exec")] == [f"/sandboxes/{sandbox.id}/exec"] * 4


async def test_sync_client_flows(service: Service) -> None:
    await anyio.to_thread.run_sync(sync_flow, service.url, None)


async def test_sync_client_flows_with_a_key(start_service) -> None:
    service = await start_service(keys=True)
    await anyio.to_thread.run_sync(sync_flow, service.url, KEY_A)


async def test_async_client_flows(service: Service) -> None:
    client = AsyncSandboxClient(service.url)
    try:
        sandbox = await client.create_sandbox(IMAGE, sandbox_id="async-1")
        other = await client.create_sandbox(IMAGE)
        job = await sandbox.exec("cat", timeout=5)
        assert (job.status, job.stdout) == ("succeeded", "")
        await sandbox.upload_content(EVERY_BYTE, "/workspace/b.bin")
        assert await sandbox.download_content("/workspace/b.bin") == EVERY_BYTE
        assert [entry["name"] for entry in await sandbox.list_files("/workspace")] == ["b.bin"]
        assert (await sandbox.heartbeat())["status"] == "ok"
        await sandbox.upload_content(b"one\ntwo\nthree\n", "/workspace/mod.txt")
        assert (await sandbox.apply_patch(PATCH))["success"] is True
        assert (await sandbox.apply_patch(PATCH))["success"] is False  # applied already: it conflicts
        assert (await sandbox.delete())["status"] == "deleted"  # aiohttp parsed it: application/json
        assert client.tracked == {other.id}
    finally:
        await client.close()  # DELETEs what is left, parsing each answer
    async with service.client() as http:
        assert (await http.get("/sandboxes")).json()["sandboxes"] == []


async def test_polling_when_the_wait_window_passes(service: Service, monkeypatch) -> None:
    """A command queued past its wait window comes back unfinished with a job id: the
    client polls /jobs until it ends, and never POSTs it again."""
    monkeypatch.setattr(jobs_module, "WAIT_MARGIN", 0.0)

    def flow() -> list[tuple[str, str]]:
        client = SandboxClient(service.url)
        sandbox = client.create_sandbox(IMAGE)
        client.request("POST", f"/sandboxes/{sandbox.id}/exec", json={"command": "sleep 2", "wait": False})
        job = sandbox.exec("echo after", timeout=1)
        assert (job.status, job.stdout) == ("succeeded", "after\n")
        sandbox.delete()
        return client.calls

    calls = await anyio.to_thread.run_sync(flow)
    assert sum(1 for method, path in calls if method == "POST" and path.endswith("/exec")) == 2
    assert any(path.startswith("/jobs/") for _, path in calls)

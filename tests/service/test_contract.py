"""The contract of orchard-env-api.md, one test per row of its endpoint table (section 2)
and per rule of sections 1, 3 and 4, with a raw HTTP client sending exactly the request
shapes Orchard's client sends. Against the local adapter (real processes), and the sim
adapter where a backend's timing must be controlled (slow or failing creates)."""

from __future__ import annotations

import base64
import re
from typing import Any

import httpx
import pytest

from tests.service.conftest import make_sandbox

JOB_FIELDS = {"job_id", "sandbox_id", "command", "status", "created_at", "stdout", "stderr", "exit_code", "error"}


def exec_body(command: str | list[str], **fields: Any) -> dict[str, Any]:
    """The SDK's exec request: every key always present (section 2, probe)."""
    return {"command": command, "timeout_seconds": None, "cwd": None, "env": None, "login_shell": False,
            "wait": True, **fields}  # fmt: skip


def assert_json(response: httpx.Response, status: int) -> Any:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert isinstance(body, dict)
    return body


def assert_job(job: dict[str, Any]) -> None:
    assert JOB_FIELDS <= set(job)
    assert isinstance(job["created_at"], float) and isinstance(job["command"], str)
    assert job["status"] in ("queued", "running", "succeeded", "failed")


# -- section 2, row by row ------------------------------------------------------------------


async def test_health(client: httpx.AsyncClient) -> None:
    assert assert_json(await client.get("/health"), 200)["status"] == "healthy"


async def test_create_without_and_with_a_callers_id(client: httpx.AsyncClient) -> None:
    made = assert_json(
        await client.post("/sandboxes", json={"image": "orchard/busybox:test", "block_network": True}), 200
    )
    assert isinstance(made["sandbox_id"], str) and made["sandbox_id"]
    assert isinstance(made["timeout"], int) and made["timeout"] > 0  # becomes the /wait timeout
    assert made["status"] in ("pending", "ready")
    body = {"image": "orchard/busybox:test", "block_network": False, "sandbox_id": "p-1a2b3c4d",
            "cpu": "500m", "memory": "256Mi", "timeout": 120}  # fmt: skip
    given = assert_json(await client.post("/sandboxes", json=body), 200)
    assert given["sandbox_id"] == "p-1a2b3c4d" and given["timeout"] == 120
    assert (given["namespace"], given["image"], given["block_network"]) == (given["namespace"], body["image"], False)


async def test_wait_answers_ready_with_the_instance_data(client: httpx.AsyncClient) -> None:
    made = (await client.post("/sandboxes", json={"image": "orchard/busybox:test", "block_network": True})).json()
    ready = assert_json(
        await client.get(f"/sandboxes/{made['sandbox_id']}/wait", params={"timeout": made["timeout"]}), 200
    )
    assert ready["ready"] is True and ready["status"] == "ready"
    assert {"namespace", "image", "block_network"} <= set(ready)


async def test_wait_408_when_not_ready_in_time(start_service) -> None:
    service = await start_service("sim", adapter_options={"create_latency": {"kind": "const", "a": 5}})
    async with service.client() as http:
        made = (await http.post("/sandboxes", json={"image": "x", "block_network": True})).json()
        late = assert_json(await http.get(f"/sandboxes/{made['sandbox_id']}/wait", params={"timeout": 0}), 408)
        assert "detail" in late
        assert (await http.get(f"/sandboxes/{made['sandbox_id']}")).json()["status"] == "pending"


async def test_wait_reports_a_failed_create(start_service) -> None:
    service = await start_service("sim", adapter_options={"create_failure_rate": 1.0})
    async with service.client() as http:
        made = (await http.post("/sandboxes", json={"image": "x", "block_network": True})).json()
        failed = assert_json(await http.get(f"/sandboxes/{made['sandbox_id']}/wait", params={"timeout": 10}), 200)
        assert failed["status"] == "failed" and failed["ready"] is False
        assert "simulated create failure" in failed["status_message"]


async def test_get_sandbox(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    got = assert_json(await client.get(f"/sandboxes/{sandbox_id}"), 200)
    assert got["sandbox_id"] == sandbox_id and got["ready"] is True and got["status"] == "ready"


async def test_delete_answers_a_json_object_then_404(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    deleted = assert_json(await client.delete(f"/sandboxes/{sandbox_id}"), 200)
    assert deleted == {"status": "deleted", "sandbox_id": sandbox_id}
    assert_json(await client.get(f"/sandboxes/{sandbox_id}"), 404)
    assert_json(await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("true")), 404)
    # A DELETE retried after its answer was lost still gets the object, not an error.
    assert assert_json(await client.delete(f"/sandboxes/{sandbox_id}"), 200)["status"] == "deleted"
    assert "detail" in assert_json(await client.delete("/sandboxes/never-made"), 404)


async def test_exec_with_wait_answers_the_complete_job(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    job = assert_json(await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("echo out; echo err >&2")), 200)
    assert_job(job)
    assert (job["status"], job["exit_code"], job["stdout"], job["stderr"]) == ("succeeded", 0, "out\n", "err\n")
    assert job["sandbox_id"] == sandbox_id and job["started_at"] <= job["completed_at"]
    listed = assert_json(await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body(["echo", "a", "b"])), 200)
    assert listed["command"] == "echo a b" and listed["stdout"] == "a b\n"
    failed = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("exit 3"))).json()
    assert (failed["status"], failed["exit_code"]) == ("failed", 3)


async def test_exec_without_wait_is_polled_through_jobs(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    started = assert_json(
        await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("sleep 1; echo done", wait=False)), 200
    )
    assert_job(started)
    assert started["status"] in ("queued", "running")
    job = started
    while job["status"] not in ("succeeded", "failed"):
        job = assert_json(await client.get(f"/jobs/{started['job_id']}"), 200)
    assert job["job_id"] == started["job_id"] and job["stdout"] == "done\n" and job["status"] == "succeeded"


async def test_get_job(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    job = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("echo x"))).json()
    again = assert_json(await client.get(f"/jobs/{job['job_id']}"), 200)
    assert again == job
    assert "detail" in assert_json(await client.get("/jobs/no-such-job"), 404)


async def test_apply_patch_clean_and_conflicting(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    content = base64.b64encode(b"one\ntwo\nthree\n").decode()
    await client.post(f"/sandboxes/{sandbox_id}/files", json={"path": "/workspace/mod.txt", "content": content})
    patch = "--- a/mod.txt\n+++ b/mod.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
    clean = assert_json(
        await client.post(f"/sandboxes/{sandbox_id}/apply_patch", json={"patch": patch, "timeout_seconds": 30}), 200
    )
    assert clean["success"] is True and clean["exit_code"] == 0
    assert isinstance(clean["stdout"], str) and isinstance(clean["stderr"], str)
    got = (await client.get(f"/sandboxes/{sandbox_id}/files", params={"path": "/workspace/mod.txt"})).json()
    assert base64.b64decode(got["content"]) == b"one\nTWO\nthree\n"
    conflict = assert_json(
        await client.post(f"/sandboxes/{sandbox_id}/apply_patch", json={"patch": patch, "timeout_seconds": 30}), 200
    )
    assert conflict["success"] is False and conflict["exit_code"] != 0 and conflict["error"]


async def test_upload_every_byte_value(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    payload = bytes(range(256)) * 3
    body = {"path": "/workspace/deep/dir/blob.bin", "content": base64.b64encode(payload).decode()}
    uploaded = assert_json(await client.post(f"/sandboxes/{sandbox_id}/files", json=body), 200)
    assert uploaded == {"success": True, "path": body["path"], "size": len(payload)}  # parents were made
    size = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("wc -c < deep/dir/blob.bin"))).json()
    assert size["stdout"].strip() == str(len(payload))


async def test_download(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("printf 'a\\000b\\377' > f.bin"))
    got = assert_json(await client.get(f"/sandboxes/{sandbox_id}/files", params={"path": "/workspace/f.bin"}), 200)
    assert base64.b64decode(got["content"]) == b"a\x00b\xff" and got["size"] == 4 and got["path"] == "/workspace/f.bin"
    relative = (await client.get(f"/sandboxes/{sandbox_id}/files", params={"path": "f.bin"})).json()
    assert relative["content"] == got["content"]
    missing = assert_json(await client.get(f"/sandboxes/{sandbox_id}/files", params={"path": "/workspace/nope"}), 404)
    assert "detail" in missing


async def test_list_files(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("mkdir -p d/sub && printf 12345 > d/f"))
    listed = assert_json(await client.get(f"/sandboxes/{sandbox_id}/files/list", params={"path": "/workspace/d"}), 200)
    entries = {entry["name"]: entry for entry in listed["files"]}
    assert set(entries) == {"sub", "f"}
    assert (entries["f"]["type"], entries["f"]["size"]) == ("file", 5)
    assert entries["sub"]["type"] == "directory"
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", entry["modified"]) for entry in entries.values())
    assert_json(await client.get(f"/sandboxes/{sandbox_id}/files/list", params={"path": "/workspace/none"}), 404)


async def test_heartbeat(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    beat = assert_json(await client.post(f"/sandboxes/{sandbox_id}/heartbeat"), 200)
    assert beat == {"status": "ok", "sandbox_id": sandbox_id}
    assert_json(await client.post("/sandboxes/unknown/heartbeat"), 404)


# -- section 4: the server semantics callers rely on -------------------------------------------


async def test_timeout_is_124_and_the_sandbox_stays_usable(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    job = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("sleep 60", timeout_seconds=1))).json()
    assert (job["status"], job["exit_code"], job["error"]) == ("failed", 124, "Command timed out after 1s")
    assert "timed out after 1s and was killed" in job["stderr"]
    again = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("echo alive"))).json()
    assert again["stdout"] == "alive\n"


async def test_cwd_env_and_missing_cwd(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("mkdir -p sub"))
    inside = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("pwd", cwd="/workspace/sub"))).json()
    assert inside["stdout"].strip().endswith("/sub")
    nowhere = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("pwd", cwd="/no/such/dir"))).json()
    assert nowhere["stdout"] == "/\n" and nowhere["status"] == "succeeded"
    env = await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body('echo "$A-$B"', env={"A": "1", "B": "2"}))
    assert env.json()["stdout"] == "1-2\n"


async def test_commands_run_in_bash_when_there_is_one(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    has_bash = (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("command -v bash"))).json()
    if has_bash["exit_code"] != 0:
        pytest.skip("this sandbox has no bash")
    job = (
        await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body('[[ a == a ]] && echo "$BASH_VERSION"'))
    ).json()
    assert job["status"] == "succeeded" and job["stdout"].strip()


# -- section 1: every answer is a JSON object -----------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/no/such/route", 404), ("PUT", "/sandboxes", 405), ("GET", "/sandboxes/x/files", 404)],
)
async def test_errors_are_json_objects_with_detail(
    client: httpx.AsyncClient, method: str, path: str, status: int
) -> None:
    body = assert_json(await client.request(method, path, params={"path": "/x"}), status)
    assert isinstance(body["detail"], str) and body["detail"]


async def test_capacity_answers_503_with_retry_after(start_service) -> None:
    service = await start_service("sim", max_sandboxes=1)
    async with service.client() as http:
        assert (await http.post("/sandboxes", json={"image": "x", "block_network": True})).status_code == 200
        full = await http.post("/sandboxes", json={"image": "x", "block_network": True})
        assert "capacity" in assert_json(full, 503)["detail"]
        assert int(full.headers["Retry-After"]) >= 1

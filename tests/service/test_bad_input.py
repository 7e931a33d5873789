"""Bad input gets the right 4xx with a JSON ``detail``, and nothing changes on the server."""

from __future__ import annotations

import base64
import json

import aiohttp
import httpx
import pytest

from tests.service.conftest import Service, make_sandbox
from tests.service.test_contract import assert_json, exec_body


async def files(http: httpx.AsyncClient, sandbox_id: str) -> str:
    """What a bad request must not change: the files in the sandbox's work dir and /tmp."""
    listing = (await http.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("ls -a; ls -a /tmp"))).json()
    return listing["stdout"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"", 400, "JSON body"),
        (json.dumps({"timeout_seconds": 5}).encode(), 422, "command"),
        (json.dumps({"command": 42}).encode(), 422, "command"),
        (json.dumps({"command": "touch x", "timeout_seconds": "soon"}).encode(), 422, "timeout_seconds"),
        (json.dumps({"command": "touch x", "env": {"A": 1}}).encode(), 422, "env"),
        (json.dumps({"command": "touch x", "env": {"BAD NAME": "1"}}).encode(), 422, "BAD NAME"),
        (json.dumps({"command": "touch x", "timeout_seconds": -1}).encode(), 422, "timeout_seconds"),
        (json.dumps({"command": "touch x", "surprise": True}).encode(), 422, "surprise"),
        (json.dumps({"command": ""}).encode(), 422, "empty"),
    ],
)
async def test_bad_exec_bodies(client: httpx.AsyncClient, body: bytes, status: int, words: str) -> None:
    sandbox_id = await make_sandbox(client)
    before = await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("ls -a"))
    answer = await client.post(
        f"/sandboxes/{sandbox_id}/exec", content=body, headers={"Content-Type": "application/json"}
    )
    assert words in assert_json(answer, status)["detail"]
    after = await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("ls -a"))
    assert after.json()["stdout"] == before.json()["stdout"]  # no x was touched


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"block_network": True}, 422),  # image missing
        ({"image": 3, "block_network": True}, 422),
        ({"image": "x", "block_network": "yes"}, 422),
        ({"image": "x", "timeout": "long"}, 422),
        ({"image": "x", "timeout": 0}, 422),
        ({"image": "x", "memory": "lots"}, 422),
        ({"image": "x", "cpu": "two"}, 422),
        ({"image": "x", "sandbox_id": "../escape"}, 422),
    ],
)
async def test_bad_create_bodies(client: httpx.AsyncClient, body: dict, status: int) -> None:
    assert "detail" in assert_json(await client.post("/sandboxes", json=body), status)
    assert (await client.get("/sandboxes")).json()["sandboxes"] == []


async def test_unknown_sandbox_and_job(client: httpx.AsyncClient) -> None:
    for method, path in [
        ("GET", "/sandboxes/nope"),
        ("GET", "/sandboxes/nope/wait"),
        ("DELETE", "/sandboxes/nope"),
        ("POST", "/sandboxes/nope/exec"),
        ("POST", "/sandboxes/nope/heartbeat"),
        ("GET", "/jobs/nope"),
    ]:
        body = exec_body("true") if path.endswith("exec") else None
        assert "not found" in assert_json(await client.request(method, path, json=body), 404)["detail"], path


async def test_the_file_api_reaches_what_commands_reach(client: httpx.AsyncClient) -> None:
    """Files and commands agree on what exists: an upload anywhere a command can write is read
    back by a command, a download of any file a command can read gives its bytes, the root lists;
    where a command cannot write, neither can an upload. A NUL byte is no path at all."""
    sandbox_id = await make_sandbox(client)

    async def run(command: str) -> dict:
        return (await client.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body(command))).json()

    for path in ("/workspace/up.txt", "/tmp/up.txt", "/workspace/../tmp/again.txt"):
        up = {"path": path, "content": base64.b64encode(path.encode()).decode()}
        assert_json(await client.post(f"/sandboxes/{sandbox_id}/files", json=up), 200)
        assert (await run(f"cat {path}"))["stdout"] == path
    passwd = await client.get(f"/sandboxes/{sandbox_id}/files", params={"path": "/etc/passwd"})
    assert base64.b64decode(assert_json(passwd, 200)["content"]).decode() == (await run("cat /etc/passwd"))["stdout"]
    listed = await client.get(f"/sandboxes/{sandbox_id}/files/list", params={"path": "/"})
    names = {entry["name"] for entry in assert_json(listed, 200)["files"]}
    assert {"etc", "tmp", "workspace"} <= names and names == set((await run("ls -A /"))["stdout"].split())
    if (await run("touch /usr/orchard-probe"))["exit_code"] != 0:  # a read-only root (local)
        up = {"path": "/usr/orchard-probe", "content": base64.b64encode(b"x").decode()}
        assert assert_json(await client.post(f"/sandboxes/{sandbox_id}/files", json=up), 400)["reason"] == "file_error"
    nul = await client.get(f"/sandboxes/{sandbox_id}/files", params={"path": "/workspace/a\0b"})
    assert assert_json(nul, 400)["reason"] == "path_outside"


async def test_bad_files_bodies(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    bad = {"path": "/workspace/f", "content": "not base64!"}
    assert "base64" in assert_json(await client.post(f"/sandboxes/{sandbox_id}/files", json=bad), 422)["detail"]
    assert_json(await client.post(f"/sandboxes/{sandbox_id}/files", json={"path": "/workspace/f"}), 422)
    assert_json(await client.get(f"/sandboxes/{sandbox_id}/files"), 422)  # path missing
    assert_json(await client.get(f"/sandboxes/{sandbox_id}/files", params={"path": "/workspace/f"}), 404)
    assert_json(await client.post(f"/sandboxes/{sandbox_id}/apply_patch", json={"timeout_seconds": 3}), 422)


async def test_upload_over_the_limit_is_413(start_service) -> None:
    service: Service = await start_service(max_body=4096)
    async with service.client() as http:
        sandbox_id = await make_sandbox(http)
        big = {"path": "/workspace/big", "content": base64.b64encode(b"x" * 8192).decode()}
        answer = await http.post(f"/sandboxes/{sandbox_id}/files", json=big)
        assert "detail" in assert_json(answer, 413)
        assert_json(await http.get(f"/sandboxes/{sandbox_id}/files", params={"path": "/workspace/big"}), 404)


async def test_wait_timeout_must_be_a_number(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    assert_json(await client.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": "soon"}), 422)


async def test_pty_init_frame_that_is_not_json(service: Service, client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{service.url}/sandboxes/{sandbox_id}/exec/pty") as ws:
            await ws.send_str("this is not json")
            frame = await ws.receive_json(timeout=10)
            assert frame["type"] == "error" and "not JSON" in frame["message"]
            closing = await ws.receive(timeout=10)
            assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == 4400
        async with session.ws_connect(f"{service.url}/sandboxes/unknown/exec/pty") as ws:
            await ws.receive(timeout=10)
        assert ws.close_code == 4404
    assert (await client.get(f"/sandboxes/{sandbox_id}")).json()["ready"] is True

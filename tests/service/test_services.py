"""Services inside a sandbox, reached from outside (issue 27): ``sandbox.expose(port)`` in the
library, and ``serve --services``' ``POST /sandboxes/{id}/services`` with its ``/s/{token}/``
proxy. The server behind them is ``inside/env_server.py`` (an OpenEnv-style HTTP+WebSocket
environment with an MCP endpoint, standard library only), started in a sandbox WITHOUT
network: every byte goes through the library's ``connect``.

Local in the default run; docker and kubernetes (a python3 image: connect's relay and the
server need it) in the soak run; kubernetes where a cluster is configured (CI)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import httpx
import pytest

import orchard_async as oa
from orchard_async.capabilities import Exposes
from tests.conftest import backend_missing, cluster_configured, docker_unready
from tests.service.conftest import Service

SERVER = (Path(__file__).parent / "inside" / "env_server.py").read_text()
PORT = 8123
START = f"cat > env_server.py <<'EOF'\n{SERVER}\nEOF\nnohup python3 env_server.py {PORT} >server.log 2>&1 &"
PYTHON_IMAGE = "orchard/python:test"
BACKENDS: dict[str, dict[str, Any]] = {
    "local": {},
    "docker": {"image": PYTHON_IMAGE},
    "kubernetes": {
        "image": os.environ.get("ORCHARD_K8S_IMAGE", PYTHON_IMAGE),
        "namespace": os.environ.get("ORCHARD_K8S_TEST_NAMESPACE", "orchard-test"),
        "context": os.environ.get("ORCHARD_K8S_TEST_CONTEXT"),
    },
}
ADAPTERS = ["local", pytest.param("docker", marks=pytest.mark.soak), pytest.param("kubernetes", marks=pytest.mark.soak)]


def big_body(size: int) -> bytes:
    """What the env server's ``/big?n=size`` sends: 64 KiB chunks, each of one byte value."""
    return b"".join(bytes([start % 251]) * min(65536, size - start) for start in range(0, size, 65536))


async def backend_ready(name: str) -> None:
    if name == "docker" and (reason := await docker_unready(BACKENDS["docker"]["image"])):
        backend_missing(reason)
    if name == "kubernetes" and not cluster_configured():
        pytest.skip("no Kubernetes cluster configured (KUBECONFIG, ~/.kube/config or ORCHARD_K8S_TEST_CONTEXT)")


async def start_server(box: oa.Sandbox, port: int = PORT) -> None:
    """The env server in the background of ``box``, answering on ``port`` before this returns."""
    await box.write_file("env_server.py", SERVER)
    started = await box.exec(f"nohup python3 env_server.py {port} >server.log 2>&1 &", timeout=30)
    assert started.ok, started
    with anyio.fail_after(30):
        while True:
            try:
                async with await box.connect(port):
                    return
            except ConnectionRefusedError:
                await anyio.sleep(0.05)


@pytest.fixture(params=ADAPTERS)
async def adapter_name(request: pytest.FixtureRequest) -> str:
    await backend_ready(request.param)
    return request.param


@pytest.fixture
async def offline_box(adapter_name: str) -> AsyncIterator[oa.Sandbox]:
    try:
        adapter = oa.get_adapter(adapter_name, **BACKENDS[adapter_name])
    except oa.AdapterUnavailable as exc:
        backend_missing(f"{adapter_name}: {exc}")
    # not `async with adapter`: a fixture's setup and teardown may run in different tasks
    try:
        async with await adapter.create(oa.SandboxSpec(network="none", ttl=300)) as box:
            await start_server(box)
            yield box
    finally:
        await adapter.close()


# -- sandbox.expose: a loopback URL in this process -----------------------------------------------


async def test_expose_carries_http_and_websocket_into_an_offline_sandbox(offline_box: oa.Sandbox) -> None:
    url = await offline_box.expose(PORT)
    assert url.startswith("http://127.0.0.1:")
    assert await offline_box.expose(PORT) == url  # one listener per port
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        assert (await http.get("/health")).json() == {"status": "healthy"}
        stepped = await http.post("/step", json={"action": {"message": "four"}})
        assert stepped.json()["reward"] == 4.0
        big = await http.get("/big", params={"n": 3_000_000})
        assert big.content == big_body(3_000_000)
    async with aiohttp.ClientSession() as session, session.ws_connect(url + "/ws") as ws:
        await ws.send_json({"type": "reset"})
        assert (await ws.receive_json())["data"]["observation"]["message"] == "ready"
        await ws.send_json({"type": "step", "data": {"message": "abc"}})
        assert (await ws.receive_json())["data"]["reward"] == 3.0
    # the sandbox has no network: the server is reachable only through the exposure
    reach = await offline_box.exec("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), 2)'")
    assert not reach.ok


async def test_unexpose_and_close_end_the_listener(offline_box: oa.Sandbox) -> None:
    url = await offline_box.expose(PORT)
    assert await offline_box.unexpose(PORT) is True
    assert await offline_box.unexpose(PORT) is False
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(base_url=url, timeout=5) as http:
            await http.get("/health")
    url = await offline_box.expose(PORT)
    async with aiohttp.ClientSession() as session, session.ws_connect(url + "/ws") as ws:
        await offline_box.close()  # an open connection ends with the sandbox
        assert (await ws.receive(timeout=30)).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(base_url=url, timeout=5) as http:
            await http.get("/health")
    with pytest.raises(oa.SandboxLost):
        await offline_box.expose(PORT)


async def test_expose_checks_its_port() -> None:
    async with oa.get_adapter("sim") as adapter, await adapter.create(oa.SandboxSpec()) as box:
        assert not isinstance(box, Exposes)  # it runs no processes: nothing to expose
    async with oa.get_adapter("local") as adapter, await adapter.create(oa.SandboxSpec()) as box:
        assert isinstance(box, Exposes)
        with pytest.raises(oa.ConfigError, match="1 to 65535"):
            await box.expose(0)


# -- serve --services ------------------------------------------------------------------------------


@pytest.fixture
async def served(
    adapter_name: str, start_service: Callable[..., Awaitable[Service]]
) -> AsyncIterator[tuple[Service, httpx.AsyncClient, str]]:
    """A service with services on, and one of its sandboxes (no network) running the env server."""
    try:
        service = await start_service(adapter_name, adapter_options=BACKENDS[adapter_name], expose_services=True)
    except oa.AdapterUnavailable as exc:
        backend_missing(f"{adapter_name}: {exc}")
    async with service.client() as http:
        created = await http.post(
            "/sandboxes", json={"image": BACKENDS[adapter_name].get("image"), "block_network": True}
        )
        assert created.status_code == 200, created.text
        sandbox_id = created.json()["sandbox_id"]
        assert (await http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 120})).json()["ready"]
        started = await http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": START, "wait": True})
        assert started.json()["exit_code"] == 0, started.text
        yield service, http, sandbox_id


async def expose(http: httpx.AsyncClient, sandbox_id: str, port: int = PORT, **body: Any) -> httpx.Response:
    return await http.post(f"/sandboxes/{sandbox_id}/services", json={"port": port, **body})


async def test_service_url_reaches_http_websocket_and_mcp_servers(
    served: tuple[Service, httpx.AsyncClient, str],
) -> None:
    service, http, sandbox_id = served
    exposed = await expose(http, sandbox_id, wait_ready=True, ready_timeout=30, ttl_seconds=600)
    assert exposed.status_code == 200, exposed.text
    answer = exposed.json()
    assert answer["sandbox_id"] == sandbox_id and answer["port"] == PORT
    assert answer["url"].startswith(service.url + "/s/") and answer["expires_at"] > time.time() + 500
    url = answer["url"]
    assert (await http.get(f"/sandboxes/{sandbox_id}/services")).json() == {"sandbox_id": sandbox_id, "ports": [PORT]}

    async with httpx.AsyncClient(timeout=30) as outsider:  # no API key: the URL is the credential
        assert (await outsider.get(url + "/health")).json() == {"status": "healthy"}
        seen = (await outsider.get(url + "/headers?a=1&b=two", headers={"X-API-Key": "k", "X-Mine": "m"})).json()
        assert seen["path"] == "/headers?a=1&b=two"
        assert seen["headers"].get("x-mine") == "m" and "x-api-key" not in seen["headers"]
        assert (await outsider.post(url + "/step", json={"action": {"message": "hello"}})).json()["reward"] == 5.0
        big = await outsider.get(url + "/big", params={"n": 2_000_000})
        assert big.content == big_body(2_000_000)
        assert (await outsider.get(url + "/nothing")).status_code == 404  # the server's own answer
        # MCP over streamable HTTP (JSON answers)
        init = await outsider.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
        assert init.json()["result"]["serverInfo"]["name"] == "env-server"
        called = await outsider.post(
            url + "/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "hi"}},
            },
        )
        assert called.json()["result"]["content"][0]["text"] == "echo: hi"

    ws_url = url.replace("http://", "ws://") + "/ws"
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(ws_url) as ws:
            await ws.send_json({"type": "reset"})
            assert (await ws.receive_json(timeout=30))["data"]["observation"]["episode"] == 1
            for n in range(20):  # a session of many frames, as a rollout drives an environment
                await ws.send_json({"type": "step", "data": {"message": "x" * n}})
                assert (await ws.receive_json(timeout=30))["data"]["reward"] == float(n)
            await ws.send_bytes(b"\x00\x01\x02" * 30000)  # binary, past one frame's small size
            assert await ws.receive_bytes(timeout=30) == (b"\x00\x01\x02" * 30000)[::-1]
            await ws.send_str(json.dumps({"type": "bye"}))
            closing = await ws.receive(timeout=30)
            assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 4200  # the server's code, passed on


async def test_service_tokens_are_checked_on_every_request(served: tuple[Service, httpx.AsyncClient, str]) -> None:
    service, http, sandbox_id = served
    url = (await expose(http, sandbox_id, wait_ready=True, ready_timeout=30)).json()["url"]
    token = url.rsplit("/s/", 1)[1]
    async with httpx.AsyncClient(timeout=30) as outsider, aiohttp.ClientSession() as session:
        assert (await outsider.get(url + "/health")).status_code == 200
        # wrong: another signature, a forged payload, garbage
        payload, _, signature = token.partition(".")
        for bad in (f"{payload}.{signature[:-2]}AA", f"{payload[:-2]}AA.{signature}", "not-a-token", "a.b"):
            refused = await outsider.get(f"{service.url}/s/{bad}/health")
            assert refused.status_code == 403 and refused.json()["reason"] == "bad_service_token"
            with pytest.raises(aiohttp.WSServerHandshakeError) as handshake:
                await session.ws_connect(f"{service.url}/s/{bad}/ws")
            assert handshake.value.status == 403
        # expired
        short = (await expose(http, sandbox_id, ttl_seconds=1)).json()
        await anyio.sleep(max(0.0, short["expires_at"] - time.time()) + 0.05)
        assert (await outsider.get(short["url"] + "/health")).status_code == 403
        # revoked: the URL dies at once, an open WebSocket with it, and a new exposure's URL differs
        ws = await session.ws_connect(url.replace("http://", "ws://") + "/ws")
        await ws.send_json({"type": "reset"})
        assert (await ws.receive_json(timeout=30))["type"] == "observation"
        revoked = await http.delete(f"/sandboxes/{sandbox_id}/services/{PORT}")
        assert revoked.json() == {"status": "revoked", "sandbox_id": sandbox_id, "port": PORT}
        assert (await ws.receive(timeout=30)).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        await ws.close()
        assert (await outsider.get(url + "/health")).status_code == 403
        assert (await http.delete(f"/sandboxes/{sandbox_id}/services/{PORT}")).status_code == 404
        again = (await expose(http, sandbox_id)).json()["url"]
        assert again != url and (await outsider.get(url + "/health")).status_code == 403
        assert (await outsider.get(again + "/health")).status_code == 200
        # the control port: the service's own, never exposable
        control = await expose(http, sandbox_id, port=int(service.url.rsplit(":", 1)[1]))
        assert control.status_code == 400 and control.json()["reason"] == "port_reserved"
        # nothing listening: 502 without the sandbox's details
        dead = (await expose(http, sandbox_id, port=PORT + 1)).json()["url"]
        unreachable = await outsider.get(dead + "/health")
        assert unreachable.status_code == 502 and str(PORT + 1) not in unreachable.text
        # closed: nothing reaches the sandbox any more
        assert (await http.delete(f"/sandboxes/{sandbox_id}")).status_code == 200
        gone = await outsider.get(again + "/health")
        assert gone.status_code in (403, 404)
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await session.ws_connect(again.replace("http://", "ws://") + "/ws")


async def test_services_are_off_unless_asked(start_service: Callable[..., Awaitable[Service]]) -> None:
    service = await start_service("local")
    async with service.client() as http:
        created = (await http.post("/sandboxes", json={"image": None, "block_network": True})).json()
        off = await expose(http, created["sandbox_id"])
        assert off.status_code == 404 and off.json()["reason"] == "services_disabled"
        assert (await http.get("/s/anything/health")).json()["reason"] == "services_disabled"


async def test_an_adapter_without_processes_has_no_services(start_service: Callable[..., Awaitable[Service]]) -> None:
    service = await start_service("sim", expose_services=True)
    async with service.client() as http:
        created = (await http.post("/sandboxes", json={"image": None, "block_network": True})).json()
        assert (await http.get(f"/sandboxes/{created['sandbox_id']}/wait")).json()["ready"]
        refused = await expose(http, created["sandbox_id"])
        assert refused.status_code == 400 and refused.json()["reason"] == "no_streams"


async def test_a_remote_sandbox_exposes_through_the_services_stream(
    start_service: Callable[..., Awaitable[Service]],
) -> None:
    """The remote adapter's sandboxes expose too: their connect is the service's stream."""
    service = await start_service("local")
    adapter = oa.get_adapter("remote", url=service.url)
    try:
        box = await adapter.create(oa.SandboxSpec(network="none", ttl=300))
        assert isinstance(box, Exposes)
        await start_server(box)
        url = await box.expose(PORT)
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            assert (await http.post("/step", json={"action": {"message": "remote"}})).json()["reward"] == 6.0
        await box.close()
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(base_url=url, timeout=5) as http:
                await http.get("/health")
    finally:
        await adapter.close()

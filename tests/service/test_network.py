"""``GET/PUT /sandboxes/{id}/network`` with Orchard's shapes: a sandbox created offline is
switched to an allowlist naming a listener on the host and back, a bad rule is a 422, and of two
changes made at the same revision exactly one wins (the other is a 409); the remote adapter's
``set_network`` goes through them."""

from __future__ import annotations

import anyio
import httpx
import pytest

import orchard_async as oa
from orchard_async.adapters.remote import RemoteAdapter
from orchard_async.capabilities import NetworkControl
from tests.conformance.test_attacks import CONNECT, host_listener
from tests.service.conftest import TEST_IMAGE, Service, make_sandbox


async def probe(http: httpx.AsyncClient, sandbox_id: str, address: str, port: int) -> bool:
    body = {"command": CONNECT + f"_connect {address} {port}", "timeout_seconds": 30, "wait": True}
    job = (await http.post(f"/sandboxes/{sandbox_id}/exec", json=body)).json()
    assert "TOOL none" not in job["stdout"], job
    return "CONNECTED" in job["stdout"]


async def test_switch_offline_to_an_allowlist_and_back(client: httpx.AsyncClient) -> None:
    sandbox_id = await make_sandbox(client)
    path = f"/sandboxes/{sandbox_id}/network"
    created = (await client.get(path)).json()
    assert created == {"sandbox_id": sandbox_id, "mode": "restricted", "allowlist": [], "revision": 0}

    for bad in (
        {"mode": "restricted", "allowlist": [{"cidr": "0.0.0.0/0", "port_start": 80}]},
        {"mode": "enabled", "allowlist": [{"cidr": "10.0.0.1", "port_start": 80}]},
        {"mode": "restricted", "allowlist": [{"cidr": "10.0.0.1"}]},
        {"mode": "open"},
    ):
        refused = await client.put(path, json=bad)
        assert (refused.status_code, refused.json()["reason"]) == (422, "invalid"), refused.text

    offline = await client.put(path, json={"mode": "restricted", "allowlist": []})
    assert offline.status_code == 200, offline.text
    gateway = await client.post(
        f"/sandboxes/{sandbox_id}/exec",
        json={"command": "ip route show default | awk '{print $3; exit}'", "wait": True},
    )
    host = gateway.json()["stdout"].strip()
    assert host, gateway.text
    with host_listener("0.0.0.0") as (port, peers), host_listener("0.0.0.0") as (other, other_peers):
        assert not await probe(client, sandbox_id, host, port)
        rule = {"cidr": host, "protocol": "tcp", "port_start": port}
        online = await client.put(path, json={"mode": "restricted", "allowlist": [rule]})
        assert online.status_code == 200, online.text
        expected = [{"cidr": f"{host}/32", "protocol": "TCP", "port_start": port, "port_end": port}]
        assert online.json() == {"sandbox_id": sandbox_id, "mode": "restricted", "allowlist": expected, "revision": 2}
        assert (await client.get(path)).json() == online.json()
        assert await probe(client, sandbox_id, host, port) and len(peers) == 1
        assert not await probe(client, sandbox_id, host, other) and not other_peers

        # Two changes at the same revision: one applies, the other is told it lost.
        answers: list[httpx.Response] = []

        async def change(body: dict) -> None:
            answers.append(await client.put(path, json={**body, "revision": 2}))

        async with anyio.create_task_group() as group:
            group.start_soon(change, {"mode": "restricted", "allowlist": []})
            group.start_soon(change, {"mode": "enabled", "allowlist": []})
        assert sorted(answer.status_code for answer in answers) == [200, 409], [a.text for a in answers]
        assert [a.json()["reason"] for a in answers if a.status_code == 409] == ["network_conflict"]
        stale = await client.put(path, json={"mode": "enabled", "allowlist": [], "revision": 1})
        assert stale.status_code == 409, stale.text

        back = await client.put(path, json={"mode": "restricted", "allowlist": []})
        assert back.status_code == 200 and back.json()["revision"] == 4, back.text
        assert not await probe(client, sandbox_id, host, port) and len(peers) == 1


async def test_the_remote_adapter_switches_through_the_service(service: Service) -> None:
    async with RemoteAdapter(url=service.url) as adapter:
        box = await adapter.create(oa.SandboxSpec(image=TEST_IMAGE, ttl=300))
        try:
            assert isinstance(box, NetworkControl)
            assert (await box.get_network()).revision == 0
            state = await box.set_network("restricted", [{"cidr": "10.213.0.1", "port_start": 8000, "port_end": 8001}])
            assert (state.mode, state.revision, state.allow[0].cidr, state.allow[0].port_end) == (
                "restricted",
                1,
                "10.213.0.1/32",
                8001,
            )
            assert await box.get_network() == state
            with pytest.raises(oa.NetworkConflict):
                await box.set_network("enabled", revision=0)
            with pytest.raises(oa.ConfigError, match="every address"):
                await box.set_network("restricted", [{"cidr": "0.0.0.0/0", "port_start": 1}])
        finally:
            await box.close()

"""A sandbox's network switched while it runs (``capabilities.NetworkControl``), on every adapter
with a shell: created offline, switched to an allowlist that names one listener on the host, then
back offline, then fully online and back; in every restricted state every destination outside
the allowlist is refused, and the sandbox cannot undo the change. Then the engine: a task whose
setup needs the network and whose agent and scoring phases must not have it.

Each listener proves it accepts (the host's own connection first), and each refusal is counted
on the listener too (no connection arrived), so a broken probe cannot pass for a refusal.

Kubernetes: the switch replaces the packet filter in the pod's network namespace (an exec into
its egress sidecar, adapters/kubernetes/egress.py), then the pod's own NetworkPolicy (checked
as an object in tests/adapters/test_kubernetes_network.py). The CI cluster's bridge CNI does
not enforce NetworkPolicies, so there the filter alone is what these checks test."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import pytest

import orchard_async as oa
from orchard_async.capabilities import NetworkControl
from tests.conformance.test_attacks import CONNECT, host_address, host_listener, prove_reachable_from_host, run

OUTSIDE = "192.0.2.1"  # TEST-NET-1: nowhere; refused by the filter, or unroutable


async def connects(box: oa.Sandbox, address: str, port: int, peers: list[str] | None = None) -> bool:
    before = len(peers) if peers is not None else 0
    _, out = await run(box, CONNECT + f"_connect {address} {port}", timeout=30)
    assert "TOOL none" not in out, "no connect tool in the sandbox"
    connected = "CONNECTED" in out
    if peers is not None:
        # The listener thread records a peer just after the probe's connect returns.
        for _ in range(150):
            if not connected or len(peers) > before:
                break
            await anyio.sleep(0.02)
        assert (len(peers) > before) == connected, f"the probe and the listener disagree: {out}, {peers}"
    return connected


@pytest.mark.soak  # about 4 s a backend (7 s on local): too much for the default run
async def test_offline_to_an_allowlist_and_back(make_adapter: Callable[..., oa.Adapter]) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        assert isinstance(box, NetworkControl)
        created = await box.get_network()
        assert (created.mode, created.allow, created.revision) == ("restricted", (), 0)
        with host_listener("0.0.0.0") as (allowed, allowed_peers), host_listener("0.0.0.0") as (other, other_peers):
            prove_reachable_from_host("127.0.0.1", allowed, allowed_peers)
            prove_reachable_from_host("127.0.0.1", other, other_peers)
            main_address = host_address()
            if main_address:  # as created: the host is out of reach
                assert not await connects(box, main_address, allowed, allowed_peers)

            offline = await box.set_network("restricted")
            gateway = offline.host_address
            assert gateway and offline.revision == 1
            assert not await connects(box, gateway, allowed, allowed_peers)

            rule = {"cidr": gateway, "port_start": allowed}
            online = await box.set_network("restricted", [rule])
            assert online.revision == 2 and online.allow[0].cidr == f"{gateway}/32"
            assert (await box.get_network()) == online
            assert await connects(box, gateway, allowed, allowed_peers), "the allowlisted listener is refused"
            assert not await connects(box, gateway, other, other_peers), "a port outside the allowlist got through"
            if main_address:
                assert not await connects(box, main_address, allowed, allowed_peers), "another address got through"
            assert not await connects(box, OUTSIDE, 80)
            # The sandbox cannot lift the filter or route around it: no CAP_NET_ADMIN in its namespace.
            await run(box, "iptables -P OUTPUT ACCEPT; iptables -F; ip route del default; ip link set egress0 down")
            assert not await connects(box, gateway, other, other_peers), "the sandbox undid the filter"
            assert await connects(box, gateway, allowed, allowed_peers)

            with pytest.raises(oa.NetworkConflict):
                await box.set_network("restricted", revision=1)
            assert (await box.get_network()).revision == 2

            back = await box.set_network("restricted")
            assert back.revision == 3
            assert not await connects(box, gateway, allowed, allowed_peers), "still online after switching back"
            assert not await connects(box, gateway, other, other_peers)

            assert (await box.set_network("enabled")).mode == "enabled"
            assert await connects(box, gateway, other, other_peers), "enabled, yet the host is refused"
            await box.set_network("restricted")
            assert not await connects(box, gateway, other, other_peers)
            assert not await connects(box, gateway, allowed, allowed_peers)
    finally:
        await box.close()


@pytest.mark.soak  # the checks are the library's (tests/core/test_network_phases.py): this is each adapter's wiring
async def test_bad_policies_are_refused_in_one_line(make_adapter: Callable[..., oa.Adapter]) -> None:
    box = await make_adapter().create(oa.SandboxSpec(ttl=300))
    try:
        assert isinstance(box, NetworkControl)
        for mode, allow in [
            ("restricted", [{"cidr": "0.0.0.0/0", "port_start": 80}]),
            ("restricted", [{"cidr": "10.0.0.1", "port_start": 0}]),
            ("restricted", [{"cidr": "example.com", "port_start": 443}]),
            ("enabled", [{"cidr": "10.0.0.1", "port_start": 80}]),
            ("open", []),
        ]:
            with pytest.raises(oa.ConfigError) as refused:
                await box.set_network(mode, allow)
            assert "\n" not in str(refused.value)
        assert (await box.get_network()).revision == 0
    finally:
        await box.close()


# -- the engine: network per phase -----------------------------------------------------------

GATEWAY = "$(ip route show default | awk '{print $3; exit}')"


@dataclass
class InstallThenWork:
    """SWE-style: setup fetches from the host (needs the network), the agent works offline,
    and scoring (offline too) checks that the agent's own attempt to reach out failed."""

    id: str
    port: int
    spec: oa.SandboxSpec = field(default_factory=lambda: oa.SandboxSpec(ttl=300))
    network: oa.PhaseNetworks = field(
        default_factory=lambda: oa.PhaseNetworks(setup=oa.ONLINE, agent=oa.OFFLINE, scoring=oa.OFFLINE)
    )
    max_steps: int = 3
    deadline: float = 120.0
    score_timeout: float = 30.0
    exec_timeout: float = 30.0

    async def setup(self, sandbox: oa.Sandbox) -> str:
        result = await sandbox.exec(CONNECT + f"_connect {GATEWAY} {self.port}", timeout=30)
        if b"CONNECTED" not in result.stdout:
            raise RuntimeError(f"setup could not reach the host: {result.text}{result.error_text}")
        await sandbox.write_file("installed", "yes")
        return "work offline"

    async def evaluate(self, sandbox: oa.Sandbox) -> oa.Reward:
        result = await sandbox.exec(CONNECT + f"_connect {GATEWAY} {self.port}", timeout=30)
        installed = (await sandbox.read_file("installed")).decode()
        scoring_offline = b"CONNECTED" not in result.stdout
        return oa.Reward(value=1.0, success=installed == "yes" and scoring_offline, info={"offline": scoring_offline})


class ReachOut:
    name = "reach-out"

    async def act(self, observation: oa.Observation) -> oa.Action:
        if observation.step == 0:
            port = observation.task.port  # type: ignore[attr-defined]
            return oa.Action(command=CONNECT + f"_connect {GATEWAY} {port}; echo DONE")
        return oa.Action(kind="submit")


@pytest.mark.soak  # 1.5 to 4 s a backend
async def test_the_engine_switches_the_network_between_phases(make_adapter: Callable[..., oa.Adapter]) -> None:
    adapter = make_adapter()
    with host_listener("0.0.0.0") as (port, peers):
        pool = oa.Pool(adapter)
        async with contextlib.aclosing(oa.rollout([InstallThenWork("net-1", port)], ReachOut(), pool)) as stream:
            [trajectory] = [t async for t in stream]
    assert trajectory.status == "finished", (trajectory.end_reason, trajectory.error)
    assert trajectory.success, trajectory.info
    agent_step = trajectory.steps[0].observation
    assert "DONE" in agent_step and "CONNECTED" not in agent_step, f"the agent reached the host: {agent_step}"
    assert len(peers) == 1, f"only the setup's connection may arrive: {peers}"
    switches = [op.outcome for op in trajectory.ops if op.name == "network"]
    assert switches == ["setup enabled", "agent restricted"], switches

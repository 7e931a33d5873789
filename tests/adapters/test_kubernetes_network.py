"""set_network on kubernetes: the pod's own NetworkPolicy rewritten to each state (objects read
back from the API server), and the policy's shapes without a cluster. The CI cluster's bridge
CNI does not enforce NetworkPolicies, so the traffic itself is checked on local and docker
(tests/conformance/test_network.py), where the filter is the adapter's own."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import orchard_async as oa
from orchard_async.capabilities import network_policy

pytest.importorskip("kubernetes_asyncio")

from orchard_async.adapters.kubernetes import KubernetesAdapter, manifests  # noqa: E402
from tests.adapters.test_kubernetes import NETPOL, _get, _names, make_adapter  # noqa: E402, F401


def test_egress_rules_per_mode() -> None:
    assert manifests.egress_rules(oa.ONLINE) == [{}]
    assert manifests.egress_rules(oa.OFFLINE) == []
    policy = network_policy(
        "restricted",
        [
            {"cidr": "203.0.113.10", "port_start": 8000, "port_end": 8001},
            {"cidr": "198.51.100.0/24", "protocol": "udp", "port_start": 30000, "port_end": 31000},
        ],
    )
    assert manifests.egress_rules(policy) == [
        {
            "to": [{"ipBlock": {"cidr": "203.0.113.10/32"}}],
            "ports": [{"protocol": "TCP", "port": 8000}, {"protocol": "TCP", "port": 8001}],
        },
        {
            "to": [{"ipBlock": {"cidr": "198.51.100.0/24"}}],
            "ports": [{"protocol": "UDP", "port": 30000, "endPort": 31000}],
        },
    ]
    manifest = manifests.allow_egress_policy("orchard-x", "uid-1", policy)
    assert manifest["spec"]["podSelector"] == {"matchLabels": {"orchard.sandbox": "orchard-x"}}
    assert manifest["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert manifests.allow_egress_policy("orchard-x", None)["spec"]["egress"] == [{}]  # as created with network="on"


async def test_the_pods_policy_follows_each_switch(make_adapter: Callable[..., KubernetesAdapter]) -> None:  # noqa: F811
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    path = adapter.api.path("networkpolicies", f"{box.id}-egress", group=NETPOL)
    try:
        assert await _names(adapter, "networkpolicies", f"orchard.sandbox={box.id}", NETPOL) == []
        state = await box.set_network("restricted", [{"cidr": "203.0.113.10", "port_start": 443}])  # type: ignore[attr-defined]
        assert state.revision == 1
        policy = await _get(adapter, path)
        assert policy["spec"]["egress"] == [
            {"to": [{"ipBlock": {"cidr": "203.0.113.10/32"}}], "ports": [{"protocol": "TCP", "port": 443}]}
        ]
        pod = await _get(adapter, adapter.api.path("pods", box.id))
        assert policy["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        await box.set_network("enabled")  # type: ignore[attr-defined]
        assert (await _get(adapter, path))["spec"]["egress"] == [{}]
        await box.set_network("restricted")  # type: ignore[attr-defined]
        assert not (await _get(adapter, path))["spec"].get("egress")
        with pytest.raises(oa.NetworkConflict):
            await box.set_network("enabled", revision=1)  # type: ignore[attr-defined]
    finally:
        await box.close()
    assert await _names(adapter, "networkpolicies", f"orchard.sandbox={box.id}", NETPOL) == []

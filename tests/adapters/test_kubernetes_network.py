"""set_network on kubernetes: the pod's own NetworkPolicy rewritten to each state (objects read
back from the API server), the pod's egress filter (adapters/kubernetes/egress.py: a
CAP_NET_ADMIN-only container whose postStart hook installs it; manifests checked as data), and
what becomes of a sandbox that kills that container. The traffic itself is checked on every adapter by
tests/conformance/test_network.py and test_attacks.py: on the CI cluster, whose bridge CNI
does not enforce NetworkPolicies, the filter alone holds it."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

import orchard_async as oa
from orchard_async.capabilities import network_policy
from orchard_async.kit.egress import filter_table

pytest.importorskip("kubernetes_asyncio")

from orchard_async.adapters.kubernetes import KubernetesAdapter, egress, manifests, watch  # noqa: E402
from orchard_async.adapters.kubernetes.api import ApiError  # noqa: E402
from tests.adapters.test_kubernetes import NETPOL, _get, _names, make_adapter  # noqa: E402, F401
from tests.adapters.test_kubernetes_manifests import NodesApi  # noqa: E402
from tests.conformance.test_attacks import CONNECT, host_listener, prove_reachable_from_host, run  # noqa: E402

EGRESS_IMAGE = "orchard/egress:bookworm"


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


def _pod(network: str, egress_image: str | None = EGRESS_IMAGE) -> dict:
    settings = manifests.PodSettings(attach_grace=60, egress_image=egress_image)
    spec = oa.SandboxSpec(ttl=300, network=network)
    return manifests.pod_manifest("orchard-x", spec, "img:1", {}, settings, identity={}, owner="me")["spec"]


def test_the_pod_holds_its_egress_filter_in_a_container_of_its_own() -> None:
    offline, online, plain = _pod("none"), _pod("on"), _pod("none", None)
    sidecar, sandbox = offline["containers"]
    # first: its postStart hook installs the filter before the sandbox container starts
    assert sidecar["name"] == egress.EGRESS_CONTAINER
    # the sandbox container is unchanged and keeps no capability
    assert sandbox["name"] == manifests.CONTAINER and sandbox == plain["containers"][0]
    assert sandbox["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert len(plain["containers"]) == 1 and "initContainers" not in offline
    assert sidecar["image"] == EGRESS_IMAGE and sidecar["imagePullPolicy"] == "Never"  # built here
    context = sidecar["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
    assert context["privileged"] is False and context["seccompProfile"] == {"type": "RuntimeDefault"}
    # the initial filter is the spec's network, as kit/egress builds it for local and docker
    hook = sidecar["lifecycle"]["postStart"]["exec"]["command"]
    assert hook[-2:] == [filter_table(oa.OFFLINE, 4), filter_table(oa.OFFLINE, 6)]
    online_hook = online["containers"][0]["lifecycle"]["postStart"]["exec"]["command"]
    assert online_hook[-2:] == [filter_table(oa.ONLINE, 4), filter_table(oa.ONLINE, 6)]
    assert ":OUTPUT DROP" in hook[-2] and "-A OUTPUT -o lo -j ACCEPT" in hook[-2]
    assert "iptables-restore" in hook[2] and "sleep" in sidecar["command"][2]
    assert sidecar["command"][-1] == "300", "without a sandbox it waits out the pod's TTL at most"
    allowed = network_policy("restricted", [{"cidr": "10.88.76.1", "port_start": 8080}])
    assert "-A OUTPUT -d 10.88.76.1/32 -p tcp -m tcp --dport 8080:8080 -j ACCEPT" in egress.apply_command(allowed)[4]
    settings = manifests.PodSettings(attach_grace=60, egress_image=EGRESS_IMAGE)
    metadata = manifests.pod_manifest("p", oa.SandboxSpec(), "i", {}, settings, identity={}, owner="")["metadata"]
    assert metadata["annotations"][manifests.DEFAULT_CONTAINER_ANNOTATION] == manifests.CONTAINER


def test_a_sized_pod_stays_guaranteed_with_its_filter() -> None:
    """Guaranteed QoS needs requests = limits for cpu and memory in every container: the filter
    gets its own where the sandbox's are set both, and none otherwise."""
    settings = manifests.PodSettings(attach_grace=60, egress_image=EGRESS_IMAGE)

    def containers(**sized: object) -> list[dict]:
        spec = oa.SandboxSpec(ttl=300, **sized)  # type: ignore[arg-type]
        return manifests.pod_manifest("p", spec, "i", {}, settings, identity={}, owner="")["spec"]["containers"]

    sidecar, sandbox = containers(cpu=1, memory="1G")
    assert sidecar["resources"] == {"requests": egress.EGRESS_RESOURCES, "limits": egress.EGRESS_RESOURCES}
    assert sandbox["resources"]["requests"] == sandbox["resources"]["limits"]
    assert "resources" not in containers(cpu=1)[0] and "resources" not in containers()[0]


def test_the_gateway_and_image_names_as_the_node_says_them() -> None:
    route = (
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\n"
        "eth0\t00004C0A\t00000000\t0001\t0\t0\t0\t00FCFFFF\n"
        "eth0\t00000000\t014C580A\t0003\t0\t0\t0\t00000000\n"
    )
    assert egress.gateway(route) == "10.88.76.1"
    assert egress.gateway(route.splitlines()[0]) is None
    node = {"status": {"images": [{"names": ["docker.io/orchard/egress:bookworm", "sha256:ab"]}]}}
    assert egress.node_has_image(node, "orchard/egress:bookworm")
    assert not egress.node_has_image(node, "orchard/egress:other")
    assert egress.node_has_image({"status": {"images": [{"names": ["docker.io/library/alpine:latest"]}]}}, "alpine")
    assert egress.image_names("registry.local:5000/egress:1") == {"registry.local:5000/egress:1"}


def test_a_pod_whose_filter_does_not_run_is_never_ready() -> None:
    def pod(phase: str, filter_state: dict, sandbox_state: dict | None = None) -> dict:
        statuses = [
            {"name": egress.EGRESS_CONTAINER, "state": filter_state},
            {"name": "sandbox", "state": sandbox_state or {"running": {}}},
        ]
        return {"status": {"phase": phase, "containerStatuses": statuses}}

    assert watch.pod_verdict(pod("Running", {"running": {}})) == ("ready", "running")
    missing = pod("Pending", {"waiting": {"reason": "ErrImageNeverPull", "message": "m"}})
    assert watch.pod_verdict(missing) == ("failed", f"{watch.EGRESS_FAILED}ErrImageNeverPull: m")
    hook_failed = pod("Running", {"terminated": {"reason": "Error", "exitCode": 137}})
    verdict, why = watch.pod_verdict(hook_failed)
    assert verdict == "failed" and why.startswith(watch.EGRESS_FAILED) and "exit code 137" in why
    # its watch ended by itself (the sandbox's processes gone): the sandbox's failure, not the filter's
    watched_out = pod("Running", {"terminated": {"reason": "Completed", "exitCode": 0}})
    verdict, why = watch.pod_verdict(watched_out)
    assert verdict == "failed" and not why.startswith(watch.EGRESS_FAILED) and "sandbox container" in why
    # ... because the sandbox's image never came (its pull still backing off): that is the reason given
    never_pulled = pod(
        "Pending", {"terminated": {"exitCode": 0}}, {"waiting": {"reason": "ImagePullBackOff", "message": "m"}}
    )
    assert watch.pod_verdict(never_pulled) == ("failed", "ImagePullBackOff: m")
    assert watch.pod_verdict(pod("Running", {"waiting": {"reason": "ContainerCreating"}}))[0] == "pending"


async def test_auto_puts_the_filter_in_the_pods_where_a_node_has_its_image() -> None:
    node = {"status": {"images": [{"names": [f"docker.io/{EGRESS_IMAGE}"]}]}}
    for nodes, status, decided in (([node], 200, "on"), ([{}], 200, "off"), ([], 403, "off")):
        adapter = KubernetesAdapter(namespace="ns5")
        assert adapter.egress_filter == "auto"
        adapter.api = NodesApi(nodes, status)  # type: ignore[assignment]
        await adapter._decide_egress_filter()
        assert adapter.egress_filter == decided
        said = adapter._egress_doctor()
        if decided == "on":
            assert said.startswith("held by a packet filter in each pod") and EGRESS_IMAGE in said
        else:
            assert said.startswith("held ONLY by NetworkPolicies") and EGRESS_IMAGE in said, said
    assert KubernetesAdapter(namespace="ns5", egress_filter="off")._egress_doctor().startswith("held ONLY by")
    assert KubernetesAdapter(namespace="ns5", control_plane_only=True).egress_filter == "off"
    with pytest.raises(oa.ConfigError, match="egress_filter"):
        KubernetesAdapter(namespace="ns5", egress_filter="maybe")


# -- on a cluster ------------------------------------------------------------------------------


async def test_the_pods_policy_follows_each_switch(make_adapter: Callable[..., KubernetesAdapter]) -> None:  # noqa: F811
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    path = adapter.api.path("networkpolicies", f"{box.id}-egress", group=NETPOL)
    try:
        # scripts/ci-kubernetes.sh loads the filter's image into the node: "auto" must find it, or
        # the conformance suite's traffic checks would test NetworkPolicies the CI's CNI ignores
        assert adapter.egress_filter == "on", adapter.egress_note
        pod = await _get(adapter, adapter.api.path("pods", box.id))
        assert [c["name"] for c in pod["spec"]["containers"]] == [egress.EGRESS_CONTAINER, manifests.CONTAINER]
        assert all("running" in c["state"] for c in pod["status"]["containerStatuses"])
        assert await _names(adapter, "networkpolicies", f"orchard.sandbox={box.id}", NETPOL) == []
        state = await box.set_network("restricted", [{"cidr": "203.0.113.10", "port_start": 443}])  # type: ignore[attr-defined]
        assert state.revision == 1 and state.host_address  # the pod's gateway: the node
        policy = await _get(adapter, path)
        assert policy["spec"]["egress"] == [
            {"to": [{"ipBlock": {"cidr": "203.0.113.10/32"}}], "ports": [{"protocol": "TCP", "port": 443}]}
        ]
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


GATEWAY = "$(ip route show default | awk '{print $3; exit}')"
KILL_OTHER_CONTAINERS = r"""
own=$(cat /proc/self/cgroup)
for dir in /proc/[0-9]*; do
  pid=${dir#/proc/}
  [ "$pid" = 1 ] && continue
  group=$(cat "$dir/cgroup" 2>/dev/null) || continue
  if [ "$group" != "$own" ]; then
    if kill -9 "$pid" 2>/dev/null; then echo "KILLED $pid"; fi
  fi
done
"""


@pytest.mark.soak  # a create, a kill and a switch: seconds
async def test_a_sandbox_that_kills_the_filters_sidecar_keeps_its_filter_and_is_ended_at_the_next_switch(
    make_adapter: Callable[..., KubernetesAdapter],  # noqa: F811
) -> None:
    """The pod shares one PID namespace: a sandbox running as root may kill the sidecar (the
    same uid is all kill asks; ptrace it may not). The filter stays in the namespace, and the
    next switch, finding no container to exec into, ends the sandbox rather than leave its
    network as it was."""
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        assert adapter.egress_filter == "on", adapter.egress_note
        with host_listener("0.0.0.0") as (port, peers):
            prove_reachable_from_host("127.0.0.1", port, peers)
            _, out = await run(box, KILL_OTHER_CONTAINERS)
            assert "KILLED" in out, f"the sandbox could not kill the sidecar: {out}"
            for _ in range(100):  # the kubelet reports the sidecar ended
                pod = await _get(adapter, adapter.api.path("pods", box.id))
                states = {c["name"]: c["state"] for c in pod["status"].get("containerStatuses") or []}
                if "terminated" in states.get(egress.EGRESS_CONTAINER, {}):
                    break
                await anyio.sleep(0.2)
            else:
                raise AssertionError(f"the sidecar still runs: {states}")
            _, out = await run(box, CONNECT + f"_connect {GATEWAY} {port}")
            assert "TOOL none" not in out and "CONNECTED" not in out, f"the filter went with its sidecar: {out}"
            assert len(peers) == 1
            with pytest.raises(oa.SandboxLost, match="egress filter could not be switched") as lost:
                await box.set_network("enabled")  # type: ignore[attr-defined]
            assert "\n" not in str(lost.value)
            assert (await box.get_network()).mode == "restricted"  # type: ignore[attr-defined]
            for _ in range(100):
                try:
                    pod = await _get(adapter, adapter.api.path("pods", box.id))
                except ApiError as exc:
                    assert exc.status == 404
                    break
                if pod["metadata"].get("deletionTimestamp"):
                    break
                await anyio.sleep(0.2)
            else:
                raise AssertionError("the sandbox whose filter cannot be switched was not ended")
            assert len(peers) == 1
    finally:
        await box.close()

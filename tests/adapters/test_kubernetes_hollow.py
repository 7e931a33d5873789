"""Control-plane-only mode on two kubemark hollow nodes (scripts/k8s-hollow-nodes.sh): 20
sandboxes through create -> Running -> delete, so the path the cluster-scale bench takes
cannot rot. Needs the cluster of `scripts/ci-kubernetes.sh run` (ORCHARD_K8S_SCRIPTS): skips
without a cluster, fails in CI when it cannot start hollow nodes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import anyio
import pytest

pytest.importorskip("kubernetes_asyncio")

from orchard_async import SandboxSpec  # noqa: E402
from orchard_async.adapters.kubernetes import KubernetesAdapter  # noqa: E402
from orchard_async.adapters.kubernetes import pod_verdict as kube_pod_verdict  # noqa: E402
from orchard_async.errors import ConfigError  # noqa: E402
from orchard_async.kit import labels as names  # noqa: E402
from tests.conftest import backend_missing, cluster_configured  # noqa: E402

NAMESPACE = os.environ.get("ORCHARD_K8S_TEST_NAMESPACE", "orchard-test")
# apart from a bench's hollow nodes (hollow-N, ports 21000+N) on the same cluster
HOLLOW_ENV = {"HOLLOW_PREFIX": "test-hollow-", "HOLLOW_BASE_PORT": "22000"}


def _hollow(*args: str) -> subprocess.CompletedProcess[str]:
    script = os.path.join(os.environ["ORCHARD_K8S_SCRIPTS"], "k8s-hollow-nodes.sh")
    return subprocess.run(
        ["bash", script, *args], env={**os.environ, **HOLLOW_ENV}, capture_output=True, text=True, timeout=660
    )


@pytest.fixture
def hollow_nodes() -> Iterator[None]:
    if not cluster_configured():
        pytest.skip("no Kubernetes cluster configured (KUBECONFIG, ~/.kube/config or ORCHARD_K8S_TEST_CONTEXT)")
    if not os.environ.get("ORCHARD_K8S_SCRIPTS") or not os.environ.get("ORCHARD_K8S_WORK"):
        backend_missing("hollow nodes need the cluster of scripts/ci-kubernetes.sh run (ORCHARD_K8S_SCRIPTS)")
    started = _hollow("start", "2")
    try:
        if started.returncode != 0:
            backend_missing(f"k8s-hollow-nodes.sh start 2 failed: {started.stderr.strip()[-500:]}")
        yield
    finally:
        _hollow("stop")


@pytest.mark.soak  # ~50 s, almost all of it starting two kubemark nodes: `pytest -m soak` (CI runs both)
async def test_twenty_sandboxes_on_hollow_nodes(hollow_nodes: None) -> None:
    adapter = KubernetesAdapter(namespace=NAMESPACE, control_plane_only=True)
    sandboxes = []
    try:
        async with anyio.create_task_group() as group:

            async def create() -> None:
                sandboxes.append(await adapter.create(SandboxSpec(ttl=300)))

            for _ in range(20):
                group.start_soon(create)
        assert len(sandboxes) == 20
        assert adapter.informer is not None
        for sandbox in sandboxes:
            pod = adapter.informer.pods[sandbox.id]
            assert pod.phase == "Running"
            assert pod.node is not None and pod.node.startswith(HOLLOW_ENV["HOLLOW_PREFIX"])
        with pytest.raises(ConfigError, match="control-plane-only"):
            await sandboxes[0].exec("true")
        assert adapter.stats["api_POST"] >= 20
        async with anyio.create_task_group() as group:
            for sandbox in sandboxes:
                group.start_soon(sandbox.close)
        assert await adapter.list_owned() == []
        selector = f"{names.RUN}={adapter.run_id}"
        assert await adapter.api.list_all(adapter.api.path("pods"), selector, "test") == []
        assert adapter.stats["api_DELETE"] >= 20
    finally:
        await adapter.close()


def test_control_plane_only_pods_go_to_hollow_nodes_only() -> None:
    adapter = KubernetesAdapter(
        namespace=NAMESPACE, control_plane_only=True, node_selector={"zone": "a"}, tolerations=[{"key": "x"}]
    )
    labels = adapter._labels(SandboxSpec(), 0.0, "orchard-x")
    pod = adapter._pod_manifest("orchard-x", SandboxSpec(), "local/busybox:1", labels)["spec"]
    assert pod["nodeSelector"] == {"zone": "a", "orchard.hollow": "true"}
    assert pod["tolerations"] == [{"key": "x"}, {"key": "orchard.hollow", "operator": "Exists", "effect": "NoSchedule"}]
    plain = KubernetesAdapter(namespace=NAMESPACE)
    spec = plain._pod_manifest("orchard-x", SandboxSpec(), "local/busybox:1", labels)["spec"]
    assert "orchard.hollow" not in spec.get("nodeSelector", {})


async def test_api_qps_bucket_lets_a_burst_through_then_spaces_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchard_async.adapters.kubernetes import api as kube_api

    now = [100.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(round(seconds, 6))

    monkeypatch.setattr(kube_api.anyio, "current_time", lambda: now[0])
    monkeypatch.setattr(kube_api.anyio, "sleep", sleep)
    bucket = kube_api.RateLimit(qps=10, burst=3)
    for _ in range(5):  # at one instant: 3 from the bucket, then 0.1 s and 0.2 s apart
        await bucket.take()
    assert slept == [0.1, 0.2]
    now[0] += 1.0  # a second refills the bucket to its size, not beyond: the 4th waits
    for _ in range(4):
        await bucket.take()
    assert slept == [0.1, 0.2, 0.1]
    assert KubernetesAdapter(namespace=NAMESPACE, api_qps=50, api_burst=100).api._rate.burst == 100


def test_a_hollow_pod_counts_as_started_even_if_its_fake_container_already_ended() -> None:
    from orchard_async.adapters.kubernetes.hollow import hollow_verdict

    ended = {"state": {"terminated": {"exitCode": 0, "startedAt": "2026-12-03T07:44:46Z"}}, "name": "sandbox"}
    assert hollow_verdict({"status": {"phase": "Succeeded", "containerStatuses": [ended]}})[0] == "ready"
    assert kube_pod_verdict({"status": {"phase": "Succeeded", "containerStatuses": [ended]}})[0] == "failed"
    scheduled = {"status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}}
    assert hollow_verdict(scheduled)[0] == "pending"


def test_the_bench_abandons_sandboxes_as_a_dead_controller_s_so_reap_takes_them() -> None:
    import json

    from orchard_async.bench.hollow import dead_controller

    dead = dead_controller()
    assert dead["host"] == names.controller_identity()["host"]
    assert names.annotated_controller_alive(json.dumps(dead)) is False  # reap's test: a crashed controller
    assert names.annotated_controller_alive(json.dumps(names.controller_identity())) is True


async def test_abandon_is_for_control_plane_only_runs() -> None:
    from orchard_async.bench.burst import run_burst

    with pytest.raises(ConfigError, match="--abandon applies to control-plane-only"):
        await run_burst("sim", sandboxes=2, commands=0, abandon=0.5)

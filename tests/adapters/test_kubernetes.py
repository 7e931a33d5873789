"""The kubernetes adapter against a real cluster (its pure parts: test_kubernetes_manifests.py).

Cluster tests run when a cluster is configured (KUBECONFIG or ~/.kube/config;
ORCHARD_K8S_TEST_CONTEXT picks a context) in namespace ORCHARD_K8S_TEST_NAMESPACE
(default orchard-test) and skip otherwise; a configured cluster that does not answer is
a failure in CI. Locally:

    bash scripts/ci-kubernetes.sh run -- python -m pytest tests/adapters/test_kubernetes.py

The API-server restart test and the RBAC test need the cluster that script starts
(ORCHARD_K8S_WORK: its PKI and its control scripts).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import orchard_async as oa

pytest.importorskip("kubernetes_asyncio")

from orchard_async.adapters import kubernetes as kube  # noqa: E402
from orchard_async.adapters.kubernetes import KubernetesAdapter  # noqa: E402
from orchard_async.images import ImageMissing, ImageSpec  # noqa: E402
from orchard_async.images import build as images  # noqa: E402
from orchard_async.kit import labels as names  # noqa: E402
from tests.conftest import backend_missing, cluster_configured  # noqa: E402

IMAGE = os.environ.get("ORCHARD_K8S_TEST_IMAGE", "local/busybox:1")
# the pod-IP relay needs python3 in the image: scripts/ci-kubernetes.sh's default image has it
RELAY_IMAGE = os.environ.get("ORCHARD_K8S_RELAY_IMAGE") or os.environ.get("ORCHARD_K8S_IMAGE", "orchard/python:test")
NAMESPACE = os.environ.get("ORCHARD_K8S_TEST_NAMESPACE", "orchard-test")
CONTEXT = os.environ.get("ORCHARD_K8S_TEST_CONTEXT")
WORK = os.environ.get("ORCHARD_K8S_WORK")
SCRIPTS = os.environ.get("ORCHARD_K8S_SCRIPTS")
REPO = Path(__file__).resolve().parents[2]
NETPOL = "networking.k8s.io/v1"


# -- against a cluster --------------------------------------------------------------------------


@pytest.fixture
async def make_adapter() -> AsyncIterator[Callable[..., KubernetesAdapter]]:
    if not cluster_configured():
        pytest.skip("no Kubernetes cluster configured (KUBECONFIG, ~/.kube/config or ORCHARD_K8S_TEST_CONTEXT)")
    made: list[KubernetesAdapter] = []

    def make(**options: Any) -> KubernetesAdapter:
        adapter = KubernetesAdapter(**{"image": IMAGE, "namespace": NAMESPACE, "context": CONTEXT, **options})
        made.append(adapter)
        return adapter

    try:
        await make().doctor()
    except oa.OrchardError as exc:
        backend_missing(f"kubernetes: {exc}")
    yield make
    for adapter in made:
        await adapter.close()
        assert await adapter.list_owned() == []


async def _get(adapter: KubernetesAdapter, path: str, **query: str) -> dict:
    return await adapter.api.request("GET", path, query=list(query.items()), what="test")


async def _names(adapter: KubernetesAdapter, resource: str, selector: str, group: str = "") -> list[str]:
    listing = await _get(adapter, adapter.api.path(resource, group=group), labelSelector=selector)
    return [item["metadata"]["name"] for item in listing.get("items") or []]


@pytest.mark.soak  # pods, policies and their removal on the cluster: about 16 s
async def test_pod_and_policies_on_the_cluster(make_adapter: Callable[..., KubernetesAdapter]) -> None:
    adapter = make_adapter()
    quiet = await adapter.create(oa.SandboxSpec(ttl=300, labels={"suite": "k8s"}, cpu=0.1, memory="64Mi"))
    online = await adapter.create(oa.SandboxSpec(ttl=300, network="on"))
    try:
        pod = await _get(adapter, adapter.api.path("pods", quiet.id))
        labels = pod["metadata"]["labels"]
        assert labels["suite"] == "k8s" and labels["orchard.run"] == adapter.run_id
        assert labels["orchard.controller"] == adapter.controller and labels["orchard.sandbox"] == quiet.id
        assert abs(int(labels["orchard.expires"]) - (time.time() + 300)) < 60
        spec = pod["spec"]
        assert spec["activeDeadlineSeconds"] == 300
        assert spec["automountServiceAccountToken"] is False and spec["shareProcessNamespace"] is True
        [container] = [c for c in spec["containers"] if c["name"] == kube.manifests.CONTAINER]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        # what doctor states, as the sandbox sees it: no capabilities, no-new-privileges, seccomp filter
        status = (await quiet.exec("grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status")).text.split()
        assert status == [
            "CapEff:", "0000000000000000", "CapBnd:", "0000000000000000", "NoNewPrivs:", "1", "Seccomp:", "2",
        ]  # fmt: skip
        assert container["resources"]["limits"] == {"cpu": "100m", "memory": str(64 * 1024**2)}
        assert not any(v.get("name", "").startswith("kube-api-access") for v in spec.get("volumes") or [])
        # the pause container is PID 1 (shareProcessNamespace) and the sandbox sees it
        assert (await quiet.exec("cat /proc/1/cmdline")).stdout.startswith(b"/pause")

        deny = await _get(adapter, adapter.api.path("networkpolicies", kube.manifests.DENY_POLICY, group=NETPOL))
        assert deny["spec"]["policyTypes"] == ["Egress"] and not deny["spec"].get("egress")
        assert deny["spec"]["podSelector"] == {"matchExpressions": [{"key": "orchard.sandbox", "operator": "Exists"}]}
        ingress = await _get(adapter, adapter.api.path("networkpolicies", kube.manifests.RELAY_POLICY, group=NETPOL))
        assert ingress["spec"] == kube.manifests.relay_ingress_policy()["spec"]
        allow = await _get(adapter, adapter.api.path("networkpolicies", f"{online.id}-egress", group=NETPOL))
        assert allow["spec"]["podSelector"] == {"matchLabels": {"orchard.sandbox": online.id}}
        assert allow["spec"]["egress"] == [{}] and allow["spec"]["policyTypes"] == ["Egress"]
        assert await _names(adapter, "networkpolicies", f"orchard.sandbox={quiet.id}", NETPOL) == []
    finally:
        await quiet.close()
        await online.close()
    assert await _names(adapter, "pods", f"orchard.sandbox in ({quiet.id},{online.id})") == []
    assert await _names(adapter, "networkpolicies", f"orchard.sandbox={online.id}", NETPOL) == []


@pytest.mark.parametrize("pull", ["never", "missing"])
async def test_missing_image_fails_clearly_and_leaves_no_pod(
    make_adapter: Callable[..., KubernetesAdapter], pull: str
) -> None:
    adapter = make_adapter()
    image = "local/does-not-exist:0"
    started = time.monotonic()
    # never: the image is not there and will not be (the user's to fix); missing: a pull was
    # tried and failed, which a registry that comes back could cure (an infrastructure error)
    expected = ImageMissing if pull == "never" else oa.CreateFailed
    with anyio.fail_after(90), pytest.raises(expected) as caught:  # the caller's create timeout
        await adapter.create(oa.SandboxSpec(ttl=120, image=image, pull=pull))
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert image in message and "\n" not in message
    assert (
        ("ErrImageNeverPull" in message)
        if pull == "never"
        else ("ErrImagePull" in message or "ImagePullBackOff" in message)
    )
    assert elapsed < 90
    assert await adapter.list_owned() == []
    assert await _names(adapter, "pods", f"orchard.run={adapter.run_id}") == []


async def test_a_missing_buildable_image_names_the_build_command_once(
    make_adapter: Callable[..., KubernetesAdapter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image `orchard-async images build` makes is never pulled; missing from the node, it
    is an ImageMissing naming the command, and later creates fail at once without a pod."""
    tag = "orchard/absent-k8s:test"
    monkeypatch.setattr(images, "TEST_IMAGES", [*images.TEST_IMAGES, ImageSpec(tag=tag, base="busybox")])
    adapter = make_adapter()
    with (
        anyio.fail_after(90),  # the caller's create timeout
        pytest.raises(
            ImageMissing,
            match=rf"^image {tag} .*ErrImageNeverPull.*`orchard-async images build {tag} --adapter kubernetes`$",
        ),
    ):
        await adapter.create(oa.SandboxSpec(ttl=120, image=tag))
    posted = adapter.stats["api_calls"]
    with pytest.raises(ImageMissing, match=tag):
        await adapter.create(oa.SandboxSpec(ttl=120, image=tag))
    assert adapter.stats["api_calls"] == posted  # answered from the cache: no pod this time
    assert await _names(adapter, "pods", f"orchard.run={adapter.run_id}") == []


# Starts N background sleeps from a child shell (which ends when a fork is refused),
# counts with builtins only (nothing to fork at the limit) how many are alive, kills them.
PIDS_BOMB = r"""
rm -f bomb.pids
sh -c 'i=0; while [ $i -lt {n} ]; do sleep 123 & echo $! >>bomb.pids; i=$((i+1)); done' 2>/dev/null
alive=0; started=
while read -r p; do if kill -0 "$p" 2>/dev/null; then alive=$((alive+1)); started="$started $p"; fi; done <bomb.pids
echo "BOMB $alive"
kill $started 2>/dev/null
"""


async def test_spec_pids_is_not_enforced_but_the_nodes_pod_limit_is(
    make_adapter: Callable[..., KubernetesAdapter],
) -> None:
    """What doctor says: spec.pids is not a pod limit on Kubernetes; the kubelet's
    podPidsLimit (ORCHARD_K8S_POD_MAX_PIDS, set by scripts/ci-kubernetes.sh) is."""
    adapter = make_adapter()
    assert "spec.pids NOT enforced" in await adapter.doctor()
    box = await adapter.create(oa.SandboxSpec(ttl=300, pids=16))
    try:
        small = await box.exec(PIDS_BOMB.replace("{n}", "40"), timeout=60)
        assert "BOMB 40" in small.text, f"spec.pids=16 is documented as not enforced here: {small}"
        limit = os.environ.get("ORCHARD_K8S_POD_MAX_PIDS")
        if limit:
            flood = await box.exec(PIDS_BOMB.replace("{n}", str(int(limit) + 32)), timeout=120)
            alive = int(flood.text.split("BOMB ")[1].split()[0])
            assert alive < int(limit), f"the pod went past its podPidsLimit {limit}: {flood}"
            assert (await box.exec("echo usable")).text == "usable\n"
    finally:
        await box.close()


@pytest.mark.soak  # waits out a create timeout: about 14 s
async def test_unschedulable_pod_fails_at_the_create_timeout_with_the_reason(
    make_adapter: Callable[..., KubernetesAdapter],
) -> None:
    """The pool owns the create timeout; the adapter's own error, a little before it, says why."""
    adapter = make_adapter(node_selector={"orchard.test/no-such-node": "true"})
    started = time.monotonic()
    with pytest.raises(oa.CreateFailed, match="Unschedulable") as caught:
        await oa.Pool(adapter, create_timeout=15).acquire(oa.SandboxSpec(ttl=60))
    assert time.monotonic() - started < 40
    assert "not ready within 15s" in str(caught.value) and "node" in str(caught.value)
    assert await _names(adapter, "pods", f"orchard.run={adapter.run_id}") == []


async def test_reap_removes_pods_of_dead_runs_only(make_adapter: Callable[..., KubernetesAdapter]) -> None:
    live = make_adapter()
    kept = await live.create(oa.SandboxSpec(ttl=300))
    dead = make_adapter(run_id="dead-run")
    await dead._ensure_namespace()
    done = await anyio.run_process([sys.executable, "-c", "import os; print(os.getpid())"])
    dead.identity = {**dead.identity, "pid": done.stdout.decode().strip()}  # a controller that has exited
    dead.controller = names.controller_label(dead.identity)
    orphan = "orchard-deadrun0000000001"
    expired = "orchard-expired000000001"
    for name, expires in ((orphan, time.time() + 300), (expired, time.time() - 5)):
        manifest = dead._pod_manifest(
            name, oa.SandboxSpec(ttl=300), IMAGE, dead._labels(oa.SandboxSpec(), expires, name)
        )
        await dead.api.request("POST", dead.api.path("pods"), body=manifest, what="test pod")
    try:
        reaper = make_adapter()
        removed = await reaper.reap()
        assert orphan in removed and expired in removed and kept.id not in removed
        assert await _names(reaper, "pods", "orchard.run=dead-run") == []
        assert (await kept.exec("echo alive")).text == "alive\n"
    finally:
        await kept.close()


async def test_persistent_session_beats_a_fresh_exec_websocket(make_adapter: Callable[..., KubernetesAdapter]) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        pod = kube.PodRef(adapter.namespace, box.id)
        persistent, fresh = [], []
        for _ in range(20):
            t = time.perf_counter()
            assert (await box.exec("true")).ok
            persistent.append(time.perf_counter() - t)
            t = time.perf_counter()
            code, _, _ = await adapter.transport.run(pod, ["true"], 30)
            fresh.append(time.perf_counter() - t)
            assert code == 0
        code, out, err = await adapter.transport.run(pod, ["sh", "-c", "echo out; echo err >&2; exit 3"], 30)
        assert (code, out, err) == (3, b"out\n", b"err\n")
        assert statistics.median(persistent) < statistics.median(fresh)
        # a shell websocket lives for its sandbox's TTL: no 5-minute total timeout on its session
        websocket = getattr(adapter.transport, "fallback", adapter.transport)  # busybox: no relay
        assert websocket._client.rest_client.pool_manager.timeout.total is None  # type: ignore[attr-defined]
    finally:
        await box.close()


async def test_closed_websocket_ends_the_pod(make_adapter: Callable[..., KubernetesAdapter]) -> None:
    """What a SIGKILLed controller leaves: its websockets close, and its pods end themselves."""
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        await box._client._stream.aclose()  # type: ignore[attr-defined]
        informer = adapter.informer
        assert informer is not None
        with anyio.fail_after(60):
            while kube.pod_verdict(informer.pods.get(box.id, {}))[0] != "failed":
                await informer.changed(box.id).wait()
    finally:
        await box.close()


CONTROLLER = """
import os, signal, sys, anyio, orchard_async as oa
from orchard_async.adapters.kubernetes import KubernetesAdapter
class DiesBeforeItsShell(KubernetesAdapter):
    async def _open_shell(self, *args, **keywords):
        print("dying", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
async def main():
    image, namespace, context, run_id, mode, grace = sys.argv[1:7]
    kind = DiesBeforeItsShell if mode == "die-mid-create" else KubernetesAdapter
    adapter = kind(image=image, namespace=namespace, context=context or None, run_id=run_id, reattach_grace=float(grace))
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    print(box.id, flush=True)
    await anyio.sleep(600)
anyio.run(main)
"""

# What the README promises (measured in CI): a SIGKILLed controller's pods are deleted within
# this many seconds (its guardian's start, one list, one delete per pod).
SELF_DESTRUCT = 15.0


async def _kill_controller(mode: str, run_id: str, grace: float = 0.0) -> None:
    """Run CONTROLLER until it has a pod (or is about to attach its shell), SIGKILL it."""
    argv = [sys.executable, "-c", CONTROLLER, IMAGE, NAMESPACE, CONTEXT or "", run_id, mode, str(grace)]
    async with await anyio.open_process(argv) as process:
        assert process.stdout is not None
        with anyio.fail_after(120):
            line = (await process.stdout.receive()).decode().strip()
        process.kill()
    assert line == "dying" or line.startswith("orchard-")


async def _pods_of(observer: KubernetesAdapter, run_id: str) -> list[str]:
    return await _names(observer, "pods", f"orchard.run={run_id}")


async def _gone_within(observer: KubernetesAdapter, run_id: str, seconds: float) -> None:
    with anyio.fail_after(seconds):
        while await _pods_of(observer, run_id):  # noqa: ASYNC110 - the API server is polled
            await anyio.sleep(0.25)


@pytest.mark.soak  # a controller process started and killed, then the reap: about 13 s
async def test_sigkilled_controller_leaves_nothing(make_adapter: Callable[..., KubernetesAdapter]) -> None:
    """A controller killed with SIGKILL: its pod ends itself (the websocket closes) and its
    guardian deletes it: gone within SELF_DESTRUCT, not at its TTL, without reap."""
    observer = make_adapter()
    await observer._ensure_namespace()
    run_id = "killed-" + os.urandom(4).hex()
    await _kill_controller("hold", run_id)
    await _gone_within(observer, run_id, SELF_DESTRUCT)


@pytest.mark.soak  # long: the default run leaves it to `pytest -m soak` (CI runs both)
async def test_a_controller_killed_before_its_shell_attached_leaves_nothing(
    make_adapter: Callable[..., KubernetesAdapter],
) -> None:
    """The pod's timer would wait the attach grace (120 s): the guardian deletes it."""
    observer = make_adapter()
    await observer._ensure_namespace()
    run_id = "killed-" + os.urandom(4).hex()
    await _kill_controller("die-mid-create", run_id)
    await _gone_within(observer, run_id, SELF_DESTRUCT)


@pytest.mark.soak
async def test_with_a_reattach_grace_a_killed_controllers_pod_lives_the_grace_then_goes(
    make_adapter: Callable[..., KubernetesAdapter],
) -> None:
    observer = make_adapter()
    await observer._ensure_namespace()
    run_id = "killed-" + os.urandom(4).hex()
    grace = 10.0
    await _kill_controller("hold", run_id, grace)
    killed_at = time.monotonic()
    while time.monotonic() - killed_at < grace - 3:  # inside the grace: still running
        listing = await _get(observer, observer.api.path("pods"), labelSelector=f"orchard.run={run_id}")
        assert [pod["status"].get("phase") for pod in listing["items"]] == ["Running"]
        await anyio.sleep(0.5)
    await _gone_within(observer, run_id, SELF_DESTRUCT + 3)


# -- commands over the pod IP (adapters/kubernetes/podip.py) -----------------------------------------


async def _relay_adapter(make_adapter: Callable[..., KubernetesAdapter], **options: Any) -> KubernetesAdapter:
    adapter = make_adapter(image=RELAY_IMAGE, **options)
    try:
        box = await adapter.create(oa.SandboxSpec(ttl=120))
    except ImageMissing as exc:
        backend_missing(f"kubernetes: the relay tests need an image with python3 on the node: {exc}")
    probe = await box.exec("command -v python3")
    await box.close()
    if not probe.ok:
        backend_missing(f"kubernetes: image {RELAY_IMAGE} has no python3 (set ORCHARD_K8S_RELAY_IMAGE)")
    return adapter


# What a sandboxed process tries against its own pod's relay: the digest it can read from the
# relay's command line (all the pod holds), and an empty secret.
RELAY_FROM_INSIDE = r"""
import glob, socket, sys
digest = ""
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        args = open(path, "rb").read().split(b"\0")
    except OSError:
        continue
    if len(args) > 4 and args[1] == b"-c" and b"PORT, DIGEST" in args[2] and len(args[4]) == 64:
        digest = args[4].decode()
for secret in (digest, ""):
    conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
    conn.sendall(secret.encode() + b"\n" + b'{"argv": ["sh", "-c", "echo ESCAPED"]}\n')
    answer = b""
    while chunk := conn.recv(4096):
        answer += chunk
    print(len(digest), answer[5:].decode(errors="replace"))
"""


async def test_commands_go_over_the_pod_ip_and_a_wrong_secret_is_refused(
    make_adapter: Callable[..., KubernetesAdapter],
) -> None:
    adapter = await _relay_adapter(make_adapter)
    transport = adapter.transport
    assert isinstance(transport, kube.PodIpTransport) and transport.relay_port
    before = dict(transport.stats)
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        result = await box.exec("echo out; echo err >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
        assert (await box.exec("sleep 30", timeout=1)).reason == oa.ExitReason.TIMEOUT  # the interrupt, by relay
        assert (await box.exec("echo still")).stdout == b"still\n"
        # the shell, its two output relays and the interrupt went over the pod IP; no exec websocket
        assert transport.stats["relay"] - before.get("relay", 0) >= 4
        assert transport.stats["exec"] == before.get("exec", 0)
        ip, secret = transport._routes[box.id]
        code, out, _ = await transport.run(kube.PodRef(adapter.namespace, box.id), ["echo", "direct"], 30)
        assert (code, out) == (0, b"direct\n")
        for wrong in ("", "0" * 64, secret[:-1] + ("1" if secret[-1] != "1" else "2")):
            with pytest.raises(kube.RelayRefused, match="wrong secret"):
                await kube.connect_relay(ip, transport.relay_port, wrong, ["echo", "in"], stdin=False)
        # from inside the sandbox: the digest the pod holds is no key, and nothing runs
        inside = await box.exec(f"python3 -c {shlex.quote(RELAY_FROM_INSIDE)} {transport.relay_port}", timeout=60)
        lines = inside.stdout.decode().splitlines()
        assert inside.ok and len(lines) == 2, inside
        assert lines[0] == "64 refused: wrong secret" and lines[1] == "64 refused: wrong secret"
        assert b"ESCAPED" not in inside.stdout
    finally:
        await box.close()


async def test_commands_fall_back_to_the_exec_websocket_when_the_pod_ip_is_not_routable(
    make_adapter: Callable[..., KubernetesAdapter],
) -> None:
    class Unroutable(kube.PodIpTransport):
        async def open_shell(self, pod: kube.PodRef, command: list[str]) -> Any:
            # TEST-NET-1 (RFC 5737): an address no cluster routes
            return await super().open_shell(msgspec.structs.replace(pod, ip="192.0.2.1"), command)

    transport = Unroutable()
    adapter = make_adapter(image=RELAY_IMAGE, transport=transport)
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        assert (await box.exec("echo over-the-websocket")).stdout == b"over-the-websocket\n"
        assert transport.stats["relay"] == 0 and transport.stats["exec"] >= 3
        assert transport.stats["fallback_unroutable"] == 1
    finally:
        await box.close()


# -- needs the cluster of scripts/ci-kubernetes.sh ------------------------------------------------


def _needs_ci_cluster() -> tuple[str, str]:
    if not (WORK and SCRIPTS and Path(WORK, "pki", "ca.key").exists()):
        pytest.skip("needs the cluster started by scripts/ci-kubernetes.sh (ORCHARD_K8S_WORK, its PKI and scripts)")
    return WORK, SCRIPTS


async def _script(*argv: str) -> None:
    done = await anyio.run_process(list(argv), check=False, env={**os.environ, "WORK": WORK or ""})
    assert done.returncode == 0, (done.stdout + done.stderr).decode(errors="replace")


@pytest.mark.soak  # long: the default run leaves it to `pytest -m soak` (CI runs both)
async def test_watch_recovers_from_an_api_server_restart(make_adapter: Callable[..., KubernetesAdapter]) -> None:
    work, scripts = _needs_ci_cluster()
    from orchard_async.engine.rollout import rollout
    from orchard_async.recipes.toy import builtin_tasks, make_policy

    adapter = make_adapter()
    episodes = 16
    trajectories = []
    some_done, restarted = anyio.Event(), anyio.Event()

    async def cut_the_control_plane() -> None:
        await some_done.wait()  # the cut lands with episodes in flight, after a few ended
        await _script("bash", f"{scripts}/k8s-cluster-up.sh", "apiserver-stop")
        await anyio.sleep(3)
        await _script("bash", f"{scripts}/k8s-cluster-up.sh", "apiserver-start")
        restarted.set()

    with anyio.fail_after(600):
        async with anyio.create_task_group() as group:
            group.start_soon(cut_the_control_plane)
            async for trajectory in rollout(
                builtin_tasks(), make_policy("oracle"), adapter, n=episodes, concurrency=4, max_retries=3
            ):
                trajectories.append(trajectory)
                if len(trajectories) >= 3:
                    some_done.set()
    assert restarted.is_set()
    assert len(trajectories) == episodes and len({t.episode_id for t in trajectories}) == episodes
    for t in trajectories:
        assert t.status == "finished" or (t.status == "failed" and t.end_reason and t.error), t
    assert sum(t.status == "finished" for t in trajectories) >= episodes - 2
    informer = adapter.informer
    assert informer is not None and informer.errors + informer.gone_410 >= 1 and informer.connected
    if adapter._retrying is not None:  # deletions the outage refused, retried in the background
        with anyio.fail_after(90):
            await adapter._retrying.wait()
    assert await adapter.list_owned() == []
    assert await _names(adapter, "pods", f"orchard.run={adapter.run_id}") == []


class _Unhurried:
    """The oracle, thinking for a while before each step: episodes stay in flight (their
    sandboxes open) through the API server's outage."""

    name = "oracle-unhurried"

    def __init__(self, policy: Any, pause: float):
        self.policy, self.pause = policy, pause

    async def act(self, observation: Any) -> Any:
        await anyio.sleep(self.pause)
        return await self.policy.act(observation)


@pytest.mark.soak  # long: the default run leaves it to `pytest -m soak` (CI runs both)
async def test_commands_over_the_pod_ip_survive_an_api_server_outage(
    make_adapter: Callable[..., KubernetesAdapter],
) -> None:
    """32 episodes; the API server is stopped for 20 s while some run: every episode finishes
    and none is retried for a lost sandbox (over the exec websocket, every one in flight is)."""
    work, scripts = _needs_ci_cluster()
    from orchard_async.engine.rollout import rollout
    from orchard_async.recipes.toy import builtin_tasks, make_policy

    adapter = await _relay_adapter(make_adapter)
    transport = adapter.transport
    assert isinstance(transport, kube.PodIpTransport)
    episodes, trajectories = 32, []
    some_done, down, restarted = anyio.Event(), anyio.Event(), anyio.Event()
    during: list[oa.ExecResult] = []
    witness = await adapter.create(oa.SandboxSpec(ttl=600))

    async def cut_the_control_plane() -> None:
        await some_done.wait()
        await _script("bash", f"{scripts}/k8s-cluster-up.sh", "apiserver-stop")
        down.set()
        for _ in range(10):  # commands while the API server is down
            during.append(await witness.exec("echo alive"))
            await anyio.sleep(2)
        await _script("bash", f"{scripts}/k8s-cluster-up.sh", "apiserver-start")
        restarted.set()

    exec_before = transport.stats["exec"]
    with anyio.fail_after(900):
        async with anyio.create_task_group() as group:
            group.start_soon(cut_the_control_plane)
            policy = _Unhurried(make_policy("oracle"), pause=1.5)
            tasks = builtin_tasks(variants=7)[:episodes]
            async for trajectory in rollout(tasks, policy, adapter, n=episodes, concurrency=8, max_retries=3):
                trajectories.append(trajectory)
                if len(trajectories) >= 4:
                    some_done.set()
    await witness.close()
    assert restarted.is_set() and down.is_set()
    assert [r.stdout for r in during] == [b"alive\n"] * 10
    assert len(trajectories) == episodes and len({t.episode_id for t in trajectories}) == episodes
    assert [t.status for t in trajectories] == ["finished"] * episodes, [t.error for t in trajectories]
    lost = [r for t in trajectories for r in t.retries if r.reason == oa.EndReason.SANDBOX_LOST]
    assert lost == []
    assert transport.stats["exec"] == exec_before  # no shell went over the websocket
    if adapter._retrying is not None:  # deletions the outage refused, retried in the background
        with anyio.fail_after(90):
            await adapter._retrying.wait()
    assert await adapter.list_owned() == []


def _yaml_documents(path: Path, namespace: str, user: str) -> list[dict]:
    import yaml

    docs = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        if doc["kind"] == "Namespace":
            doc["metadata"]["name"] = namespace
        else:
            doc["metadata"]["namespace"] = namespace
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            doc["subjects"] = [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]
        docs.append(doc)
    return docs


@pytest.mark.soak  # a restricted identity made and used on the cluster: about 20 s
async def test_rbac_role_is_enough(make_adapter: Callable[..., KubernetesAdapter], tmp_path: Path) -> None:
    """The Role in deploy/kubernetes/rbac.yaml lets a user with nothing else run sandboxes."""
    work, _ = _needs_ci_cluster()
    namespace, user = "orchard-rbac", "orchard-rbac-tester"
    admin = make_adapter(namespace=namespace)
    await admin._start()
    paths = {"Namespace": "/api/v1/namespaces", "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts"}
    paths |= {
        "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
        "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    }
    deploy = REPO / "deploy" / "kubernetes"
    for file in ("namespace.yaml", "rbac.yaml"):
        for doc in _yaml_documents(deploy / file, namespace, user):
            try:
                await admin.api.request("POST", paths[doc["kind"]].format(ns=namespace), body=doc, what="apply")
            except kube.ApiError as exc:
                assert exc.status == 409, exc
    # a client certificate for the user, signed by the cluster's CA
    pki = Path(work, "pki")
    key, csr, crt = tmp_path / "u.key", tmp_path / "u.csr", tmp_path / "u.crt"
    await anyio.run_process(
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={user}"]
    )
    await anyio.run_process(
        ["openssl", "x509", "-req", "-in", csr, "-CA", pki / "ca.crt", "-CAkey", pki / "ca.key"]
        + ["-CAcreateserial", "-days", "1", "-out", crt]
    )
    server = admin.server
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")}}
                ],
                "users": [{"name": "u", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
                "contexts": [{"name": "restricted", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "restricted",
            }
        )
    )
    restricted = make_adapter(namespace=namespace, kubeconfig=str(kubeconfig), context="restricted")
    boxes = [
        await restricted.create(oa.SandboxSpec(ttl=120, max_extension=60)),
        await restricted.create(oa.SandboxSpec(ttl=120, network="on")),
    ]
    try:
        for box in boxes:
            assert (await box.exec("echo $((6 * 7))")).text == "42\n"
            timed_out = await box.exec("sleep 30", timeout=1)  # the interrupt is a second exec
            assert timed_out.reason is oa.ExitReason.TIMEOUT
        # nodes: list lets "auto" find the filter's image; the switch reads the pod and rewrites its policy
        assert restricted.egress_filter == "on", restricted.egress_note
        assert (await boxes[0].set_network("enabled")).revision == 1
        assert (await boxes[1].set_network("restricted")).mode == "restricted"
        assert await boxes[0].extend_ttl(30) > time.time() + 120  # pods: patch is allowed
    finally:
        for box in boxes:
            await box.close()
    assert await restricted.reap() == []
    with pytest.raises(ImageMissing, match="ErrImageNeverPull"):  # the pod's status: get and watch are allowed
        await restricted.create(oa.SandboxSpec(ttl=60, image="local/nope:0", pull="never"))
    with pytest.raises(oa.CreateFailed, match="local/nope:0.*ErrImagePull|local/nope:0.*ImagePullBackOff"):
        await restricted.create(oa.SandboxSpec(ttl=60, image="local/nope:0", pull="missing"))  # events: list is allowed

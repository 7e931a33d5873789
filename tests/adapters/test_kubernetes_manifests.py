"""The kubernetes adapter's pure parts, no cluster needed: the pod and policy manifests, the
labels and the controller identity, pod verdicts, exec statuses, the reap's refusal to
delete after a failed list, and the reason a slow create gives under the pool's timeout."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import orchard_async as oa
from orchard_async.kit import labels as names

pytest.importorskip("kubernetes_asyncio")

from orchard_async.adapters.kubernetes import KubernetesAdapter, forks, manifests, transport, watch  # noqa: E402
from orchard_async.adapters.kubernetes.api import ApiError  # noqa: E402

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_label_values_are_valid() -> None:
    for text in ["root@host", "-x-", "a" * 100, "ünïcode user", "ok.value_1"]:
        value = names.label_value(text)
        assert len(value) <= 63 and LABEL_VALUE.match(value), value
    identity = {"host": "a-very-long-host-name." * 5, "pid": "123456", "start": "987654321"}
    label = names.controller_label(identity)
    assert len(label) <= 63 and LABEL_VALUE.match(label) and label.endswith(".123456.987654321")


def test_controller_liveness_from_the_annotation() -> None:
    me = names.controller_identity()
    assert names.annotated_controller_alive(json.dumps(me)) is True
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = {**me, "pid": done.stdout.strip()}
    assert names.annotated_controller_alive(json.dumps(dead)) is False
    assert names.annotated_controller_alive(json.dumps({**me, "host": "another-host"})) is None
    assert names.annotated_controller_alive(json.dumps({**me, "pidns": "pid:[1]"})) is None
    assert names.annotated_controller_alive(None) is None and names.annotated_controller_alive("garbage") is None


def _pod(phase: str = "Pending", state: dict | None = None, conditions: list | None = None, **status: Any) -> dict:
    statuses = [{"name": "sandbox", "state": state}] if state is not None else []
    return {"status": {"phase": phase, "containerStatuses": statuses, "conditions": conditions or [], **status}}


def test_pod_verdicts() -> None:
    assert watch.pod_verdict(_pod("Running", {"running": {}}))[0] == "ready"
    assert watch.pod_verdict(_pod("Pending", {"waiting": {"reason": "ContainerCreating"}}))[0] == "pending"
    verdict, why = watch.pod_verdict(
        _pod("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}})
    )
    assert verdict == "failed" and "ImagePullBackOff" in why and "Back-off pulling" in why
    unschedulable = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}]
    assert watch.pod_verdict(_pod(conditions=unschedulable)) == ("pending", "Unschedulable: 0/1 nodes")
    ended = watch.pod_verdict(_pod("Failed", {"terminated": {"exitCode": 137}}, reason="DeadlineExceeded"))
    assert ended[0] == "failed" and "DeadlineExceeded" in ended[1]


def test_a_pod_whose_filter_saw_the_sandbox_end_says_how_it_ended() -> None:
    def with_filter_done(sandbox: dict) -> dict:
        pod = _pod("Running", sandbox)
        pod["status"]["containerStatuses"].insert(0, {"name": "egress", "state": {"terminated": {"exitCode": 0}}})
        return pod

    gone = "the sandbox container's processes ended before the pod was ready"
    assert watch.pod_verdict(with_filter_done({"running": {}})) == ("failed", gone)
    started_wrong = {"terminated": {"reason": "StartError", "message": "exec: no such file", "exitCode": 128}}
    assert watch.pod_verdict(with_filter_done(started_wrong)) == (
        "failed",
        f"{gone} (StartError, exec: no such file, exit code 128)",
    )
    assert watch.pod_verdict(with_filter_done({"terminated": {"exitCode": 0}})) == ("failed", f"{gone} (exit code 0)")


def _watched_pod(name: str, state: dict, version: str) -> dict:
    """A pod as the API server sends it in a watch event: spec, managedFields and all."""
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "resourceVersion": version,
            "labels": {"orchard.run": "r1", "orchard.sandbox": name},
            "annotations": {"orchard/controller": json.dumps({"host": "h", "pid": "1"})},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {"f:phase": {}}}}] * 4,
        },
        "spec": {"nodeName": "node-1", "containers": [{"name": "sandbox", "image": "busybox", "args": ["x"] * 20}]},
        "status": {
            "phase": "Running" if "running" in state else "Failed",
            "podIP": "10.0.0.7",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"name": "relay", "state": {"running": {}}},
                {"name": "sandbox", "state": state, "image": "busybox", "containerID": "containerd://c0ffee"},
            ],
        },
    }


def test_the_watch_keeps_only_what_the_adapter_reads() -> None:
    """Each watch event becomes a small PodState (not the pod), from which the verdicts, the
    pod IP and the node read the same as from the whole pod; bookmarks move the version on,
    deletions and the API's errors are handled as before."""
    informer = watch.PodInformer(None, "orchard.run=r1")  # type: ignore[arg-type]
    informer.creating.add("p1")

    def event(kind: str, obj: dict) -> bytes:
        return json.dumps({"type": kind, "object": obj}).encode() + b"\n"

    running = _watched_pod("p1", {"running": {"startedAt": "2026-12-03T07:44:46Z"}}, "11")
    assert informer._apply(event("ADDED", running), "10") == "11"
    kept = informer.pods["p1"]
    assert isinstance(kept, watch.PodState)
    assert (kept.name, kept.phase, kept.pod_ip, kept.node) == ("p1", "Running", "10.0.0.7", "node-1")
    assert kept.container_id == "containerd://c0ffee" and forks._container_id(kept) == "c0ffee"  # what a fork reads
    assert watch.pod_verdict(kept) == watch.pod_verdict(running) == ("ready", "running")
    assert len(watch.msgspec.json.encode(kept)) < len(json.dumps(running)) / 3

    ended = _watched_pod("p1", {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": "t"}}, "12")
    assert informer._apply(event("MODIFIED", ended), "11") == "12"
    assert watch.pod_verdict(informer.pods["p1"]) == watch.pod_verdict(ended)
    assert watch.pod_verdict(ended)[0] == "failed"

    assert informer._apply(event("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "13"}}), "12") == "13"
    assert set(informer.pods) == {"p1"}
    assert informer._apply(event("DELETED", ended), "13") == "12"
    assert informer.pods == {} and informer.gone == {"p1"} and informer.events == 4

    with pytest.raises(watch._Gone):
        informer._apply(event("ERROR", {"kind": "Status", "status": "Failure", "code": 410, "reason": "Expired"}), "")
    with pytest.raises(watch.ApiError) as caught:
        informer._apply(event("ERROR", {"status": "Failure", "code": 500, "message": "etcd is down"}), "")
    assert caught.value.status == 500 and "etcd is down" in str(caught.value)


def test_exit_code_from_the_exec_status() -> None:
    assert transport.exit_code('{"metadata":{},"status":"Success"}') == 0
    failure = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }
    assert transport.exit_code(json.dumps(failure)) == 3
    assert transport.exit_code("") is None


def test_pod_manifest_from_the_spec() -> None:
    settings = manifests.PodSettings(
        attach_grace=120,
        node_selector={"pool": "sandboxes"},
        tolerations=[{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
        runtime_class="gvisor",
    )
    identity = {"host": "h", "pidns": "pid:[9]", "pid": "42", "start": "7"}
    spec = oa.SandboxSpec(cpu=0.5, memory="256Mi", ttl=600, env={"A": "1"}, labels={"team": "x"}, pull="never")
    labels = manifests.sandbox_labels(
        spec, name="orchard-abc", owner="me@host", run="run1", expires_at=2000000000.0, controller="h.42.7"
    )
    manifest = manifests.pod_manifest("orchard-abc", spec, "img:1", labels, settings, identity=identity, owner="me@x")
    pod, container = manifest["spec"], manifest["spec"]["containers"][0]
    assert manifest["metadata"]["labels"] == {
        "team": "x",
        "orchard.owner": "me_host",
        "orchard.run": "run1",
        "orchard.expires": "2000000000",
        "orchard.controller": "h.42.7",
        "orchard.sandbox": "orchard-abc",
    }
    assert manifest["metadata"]["annotations"] == {"orchard/controller": json.dumps(identity), "orchard/owner": "me@x"}
    assert pod["activeDeadlineSeconds"] == 600 and pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False and pod["shareProcessNamespace"] is True
    assert pod["nodeSelector"] == {"pool": "sandboxes"} and pod["tolerations"][0]["key"] == "sandbox"
    assert pod["runtimeClassName"] == "gvisor" and "priorityClassName" not in pod
    assert container["imagePullPolicy"] == "Never"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": str(256 * 1024**2)},
        "limits": {"cpu": "500m", "memory": str(256 * 1024**2)},
    }
    assert container["env"] == [{"name": "A", "value": "1"}]
    # the timer: the attach grace, the rest of the TTL, the shell's pid file
    assert container["command"][:2] == ["sh", "-c"] and "sleep" in container["command"][2]
    assert container["command"][4:] == ["120", "480", "/tmp/.orchard/shell.pid"]
    assert "volumes" not in pod and "readOnlyRootFilesystem" not in container["securityContext"]

    def built(pull: str, image: str, **options: Any) -> dict:
        settings = manifests.PodSettings(attach_grace=60, **options)
        return manifests.pod_manifest("p", oa.SandboxSpec(pull=pull), image, {}, settings, identity=identity, owner="")

    for pull, policy in (("missing", "IfNotPresent"), ("always", "Always")):
        assert built(pull, "i")["spec"]["containers"][0]["imagePullPolicy"] == policy
    # what `orchard-async images build` makes is on no registry: "missing" never pulls it
    assert built("missing", "orchard/busybox:test")["spec"]["containers"][0]["imagePullPolicy"] == "Never"
    read_only = built("missing", "i", read_only=True)["spec"]
    assert read_only["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in read_only["containers"][0]["volumeMounts"]}
    assert mounts == {"/workspace", "/tmp/.orchard"} and all("emptyDir" in v for v in read_only["volumes"])


def test_gpus_are_limits_of_the_device_plugins_resource_with_their_runtime_class() -> None:
    identity = {"host": "h", "pidns": "pid:[9]", "pid": "42", "start": "7"}

    def built(spec: oa.SandboxSpec, **options: Any) -> dict:
        settings = manifests.PodSettings(attach_grace=60, runtime_class="gvisor", **options)
        return manifests.pod_manifest("p", spec, "i", {}, settings, identity=identity, owner="")["spec"]

    pod = built(oa.SandboxSpec(gpus=2, cpu=1), gpu_runtime_class="nvidia")
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "1000m", "nvidia.com/gpu": "2"},
        "limits": {"cpu": "1000m", "nvidia.com/gpu": "2"},
    }
    assert pod["runtimeClassName"] == "nvidia"
    cpu_only = built(oa.SandboxSpec(), gpu_runtime_class="nvidia")
    assert cpu_only["runtimeClassName"] == "gvisor" and "resources" not in cpu_only["containers"][0]
    assert built(oa.SandboxSpec(gpus=1))["runtimeClassName"] == "gvisor"  # no GPU class: the adapter's own
    node = {"status": {"allocatable": {"nvidia.com/gpu": "4", "cpu": "8"}}}
    assert manifests.gpus_of(node) == 4 and manifests.gpus_of({"status": {"allocatable": {"cpu": "8"}}}) == 0
    assert manifests.gpus_of({**node, "spec": {"unschedulable": True}}) == 0
    adapter = KubernetesAdapter(image="img:1", namespace="ns1", gpu_runtime_class="nvidia")
    assert adapter._pod_manifest("x", oa.SandboxSpec(gpus=1), "img:1", {})["spec"]["runtimeClassName"] == "nvidia"


class NodesApi:
    """The API server's answer to a list of nodes, or its refusal."""

    def __init__(self, nodes: list[dict] | None = None, status: int = 200):
        self.nodes, self.status, self.asked = nodes or [], status, 0

    async def request(self, method: str, path: str, **_: Any) -> dict:
        self.asked += 1
        assert (method, path) == ("GET", "/api/v1/nodes")
        if self.status != 200:
            raise ApiError(self.status, "Forbidden", "nodes is forbidden")
        return {"items": self.nodes}


async def test_a_spec_asking_for_more_gpus_than_any_node_has_is_refused_in_one_line() -> None:
    adapter = KubernetesAdapter(namespace="ns4")
    gpu_node = {"status": {"allocatable": {"nvidia.com/gpu": "2"}}}
    for nodes, wanted, refused in (([], 1, True), ([gpu_node], 2, False), ([gpu_node], 3, True)):
        adapter.api = NodesApi(nodes)  # type: ignore[assignment]
        if refused:
            with pytest.raises(oa.ConfigError, match=f"gpus={wanted}, but no node") as caught:
                await adapter._check_gpus(wanted)
            assert "\n" not in str(caught.value)
        else:
            await adapter._check_gpus(wanted)
    adapter.api = NodesApi(status=403)  # type: ignore[assignment]
    await adapter._check_gpus(8)  # a key that may not list nodes leaves it to the scheduler


def test_the_adapter_builds_pods_from_its_options() -> None:
    adapter = KubernetesAdapter(image="img:1", namespace="ns1", run_id="run1", priority_class="high", attach_grace=30)
    spec = oa.SandboxSpec(ttl=20)
    manifest = adapter._pod_manifest("orchard-x", spec, "img:1", adapter._labels(spec, 1.0, "orchard-x"))
    assert manifest["spec"]["priorityClassName"] == "high"
    assert manifest["spec"]["containers"][0]["command"][4:6] == ["20", "0"]  # the grace is cut to the TTL
    assert manifest["metadata"]["labels"]["orchard.controller"] == adapter.controller
    assert json.loads(manifest["metadata"]["annotations"]["orchard/controller"]) == adapter.identity


def test_network_policies_select_the_right_pods() -> None:
    deny = manifests.deny_egress_policy()
    assert deny["spec"]["policyTypes"] == ["Egress"] and deny["spec"]["egress"] == []
    assert deny["spec"]["podSelector"] == {"matchExpressions": [{"key": "orchard.sandbox", "operator": "Exists"}]}
    allow = manifests.allow_egress_policy("orchard-abc", "uid-1")
    assert allow["metadata"]["name"] == "orchard-abc-egress"
    assert allow["spec"]["podSelector"] == {"matchLabels": {"orchard.sandbox": "orchard-abc"}}
    assert allow["spec"]["egress"] == [{}] and allow["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert "ownerReferences" not in manifests.allow_egress_policy("orchard-abc", None)["metadata"]


async def test_missing_configuration_is_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    with pytest.raises(oa.AdapterUnavailable, match="does not exist"):
        await KubernetesAdapter().doctor()
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(oa.AdapterUnavailable, match="no Kubernetes configuration"):
        await KubernetesAdapter().doctor()
    (tmp_path / "cfg").write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "cfg"))
    with pytest.raises(oa.AdapterUnavailable):
        await KubernetesAdapter(context="missing").doctor()


async def test_reap_deletes_nothing_when_a_list_fails() -> None:
    adapter = KubernetesAdapter(namespace="ns1")
    calls: list[tuple[str, str]] = []

    async def fake_start() -> None:
        pass

    async def fake_request(method: str, path: str, **kwargs: Any) -> dict:
        calls.append((method, path))
        if method == "GET" and path.endswith("/networkpolicies"):
            return {"items": [{"metadata": {"name": "orchard-x-egress", "labels": {"orchard.sandbox": "orchard-x"}}}]}
        raise oa.BackendUnavailable("the API server went away")

    adapter._start = fake_start  # type: ignore[method-assign]
    adapter.api.request = fake_request  # type: ignore[method-assign]
    with pytest.raises(oa.BackendUnavailable):
        await adapter.reap()
    assert calls and all(method == "GET" for method, _ in calls)


def test_options_are_a_checked_struct() -> None:
    """Bad options fail at construction with one line naming the option; get_adapter lists
    the struct's fields (and the transport) as the adapter's options."""
    from orchard_async.adapters.kubernetes import KubernetesConfig
    from orchard_async.runtime import adapter_options

    for bad, field in (
        ({"max_api": 0}, "max_api"),
        ({"api_timeout": -1}, "api_timeout"),
        ({"create_timeout": 5}, "create_timeout"),  # the pool's setting (Pool(create_timeout=...)), not the adapter's
        ({"tolerations": {}}, "tolerations"),
    ):
        with pytest.raises(oa.ConfigError, match=field) as caught:
            KubernetesAdapter(**bad)
        assert "\n" not in str(caught.value)
    with pytest.raises(oa.ConfigError, match="not a valid Kubernetes namespace"):
        KubernetesAdapter(namespace="Not_Valid")
    with pytest.raises(oa.ConfigError, match="no option 'namespaces'"):
        oa.get_adapter("kubernetes", namespaces="x")
    assert {"transport", *KubernetesConfig.__struct_fields__} <= set(adapter_options(KubernetesAdapter)[0] or [])
    adapter = oa.get_adapter("kubernetes", namespace="ns2", attach_grace=5, node_selector={"a": "b"})
    assert adapter.namespace == "ns2" and adapter.config.attach_grace == 5
    assert adapter.pod_settings.node_selector == {"a": "b"}


class PendingApi:
    """An API server whose pods never get scheduled: what ``create`` sees from it."""

    started = True
    WARNING = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector"

    def __init__(self, informer_of: Any) -> None:
        self.informer_of = informer_of  # the adapter, whose pod watch "sees" each pod made
        self.deleted: list[str] = []

    def path(self, resource: str, name: str = "", group: str = "") -> str:
        return f"/{resource}/{name}".rstrip("/")

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict:
        assert method == "POST" and path == "/pods"
        name = body["metadata"]["name"]
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": self.WARNING}
        self.informer_of.informer.pods[name] = watch.pod_state(
            {"metadata": {"name": name}, "status": {"phase": "Pending", "conditions": [condition]}}
        )
        return {"metadata": {"name": name, "uid": "u1"}}

    async def last_warning(self, name: str) -> str:
        return f"FailedScheduling: {self.WARNING}"

    async def delete(self, path: str, what: str) -> None:
        self.deleted.append(path)

    async def close(self) -> None:
        pass


async def test_a_slow_create_fails_with_its_reason_before_the_pools_create_timeout() -> None:
    """The pool owns the create timeout; the adapter gives up a little before it with its own
    CreateFailed, which says why the pod is not ready, and deletes the pod."""
    adapter = KubernetesAdapter(namespace="ns3", manage_network_policies=False)
    api = PendingApi(adapter)
    adapter.api = api  # type: ignore[assignment]
    adapter._started = adapter._namespace_ready = True  # no cluster to set up
    adapter._create_gate = anyio.Semaphore(1)
    adapter.informer = watch.PodInformer(api, "orchard.run=x")  # type: ignore[arg-type]
    adapter.informer.synced.set()
    pool = oa.Pool(adapter, create_timeout=1.5)
    with pytest.raises(oa.CreateFailed) as caught:
        await pool.acquire(oa.SandboxSpec(ttl=60))
    message = str(caught.value)
    # the budget is what was left of the pool's 1.5 s when the adapter began: a little less under load
    assert re.search(r"was not ready within 1\.\d+s: Unschedulable", message) and "node affinity" in message, message
    (name,) = [path.rpartition("/")[2] for path in api.deleted]
    assert name.startswith("orchard-") and name in message
    assert await adapter.list_owned() == []
    await adapter.close()


def test_a_pod_with_a_reattach_grace_records_its_timer_in_words_kubernetes_keeps() -> None:
    """With a reattach grace the pod's command records the timer's pid for the session's end
    to spare; Kubernetes rewrites `$$` in a command to `$` (and expands `$(NAME)`), so the
    command must hold neither, or the timer dies with the first controller."""
    adapter = KubernetesAdapter(namespace="ns", reattach_grace=60)
    spec = oa.SandboxSpec(ttl=300, workdir="/work")
    labels = adapter._labels(spec, 1e10, "pod-a")
    command = adapter._pod_manifest("pod-a", spec, "img", labels)["spec"]["containers"][0]["command"]
    assert labels[names.REATTACH] == "60.0"
    assert "timer.pid" in " ".join(command) and "/work" in command
    assert not any("$$" in part or "$(" in part for part in command)
    plain = KubernetesAdapter(namespace="ns")
    assert names.REATTACH not in plain._labels(spec, 1e10, "pod-b")
    assert "timer.pid" not in " ".join(
        plain._pod_manifest("pod-b", spec, "img", {})["spec"]["containers"][0]["command"]
    )


def test_an_extendable_pod_has_its_hard_cap_as_its_deadline_and_its_deadline_out_of_its_reach() -> None:
    """max_extension: activeDeadlineSeconds is the TTL plus it (the hard cap, which the kubelet
    enforces whatever the timer does); the deadline the timer re-reads is an annotation projected
    read-only into the sandbox's container; a plain spec's pod is as before."""
    adapter = KubernetesAdapter(namespace="ns")
    spec = oa.SandboxSpec(ttl=300, max_extension=600)
    labels = adapter._labels(spec, 1e9, "pod-a")
    pod = adapter._pod_manifest("pod-a", spec, "img", labels)
    (container,) = pod["spec"]["containers"]
    assert pod["spec"]["activeDeadlineSeconds"] == 900
    assert pod["metadata"]["annotations"]["orchard.deadline"] == str(10**9 + 1)
    assert {"name": "ttl", "mountPath": "/run/orchard-ttl", "readOnly": True} in container["volumeMounts"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "ttl"]
    assert volume["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == "metadata.annotations['orchard.deadline']"
    assert container["command"][-2:] == ["/run/orchard-ttl/deadline", str(10**9 + 601)]
    assert not any("$$" in part or "$(" in part for part in container["command"])
    plain = adapter._pod_manifest("pod-b", oa.SandboxSpec(ttl=300), "img", adapter._labels(spec, 1e9, "pod-b"))
    assert plain["spec"]["activeDeadlineSeconds"] == 300 and "volumes" not in plain["spec"]
    assert "orchard.deadline" not in plain["metadata"]["annotations"]

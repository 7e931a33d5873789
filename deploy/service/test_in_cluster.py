"""Smoke test of deploy/service/serve.yaml on the project's one-node cluster.

    bash deploy/service/build-test-image.sh
    ORCHARD_K8S_EXTRA_IMAGES="orchard/swe-python:bookworm orchard/serve:test" \
        bash scripts/ci-kubernetes.sh run -- /work/venv/bin/python deploy/service/test_in_cluster.py

Applies the manifests as they are, with what this cluster needs on top (no registry: the
image orchard/serve:test, never pulled; no kube-proxy and an API server on loopback: the pod
on the host network with KUBERNETES_SERVICE_HOST/PORT pointing there), a keys Secret with a
fresh key; then, through the remote adapter with that key: create a sandbox (a pod the
service makes with its in-cluster service account), run commands, move a file, delete it;
a wrong key is refused; no sandbox pod is left. Exits non-zero on any failure.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import anyio
import httpx
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio import utils as k8s_utils

import orchard_async as oa
from orchard_async.apps.serve import hash_key

HERE = Path(__file__).parent
PORT = 18000
NAMESPACE = "orchard"


def manifests(api_host: str, api_port: str) -> list[dict]:
    documents = [d for d in yaml.safe_load_all((HERE / "serve.yaml").read_text()) if d]
    for document in documents:
        if document["kind"] != "Deployment":
            continue
        pod = document["spec"]["template"]["spec"]
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
        container = pod["containers"][0]
        container["image"], container["imagePullPolicy"] = "orchard/serve:test", "Never"
        container["args"] = [a if not a.startswith("--port=") else f"--port={PORT}" for a in container["args"]]
        container["ports"] = [{"name": "http", "containerPort": PORT}]
        container["env"] = [
            {"name": "KUBERNETES_SERVICE_HOST", "value": api_host},
            {"name": "KUBERNETES_SERVICE_PORT", "value": api_port},
            {"name": "ORCHARD_K8S_IMAGE", "value": os.environ.get("ORCHARD_K8S_IMAGE", "local/busybox:1")},
        ]
        container["resources"] = {}  # a 2-core test machine
    return documents


async def main() -> None:
    await k8s_config.load_kube_config()
    api = k8s.ApiClient()
    server = urlparse(api.configuration.host)
    core = k8s.CoreV1Api(api)
    try:
        await core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
    key = os.urandom(24).hex()
    keys_json = json.dumps({"keys": [{"name": "ci", "sha256": hash_key(key), "max_sandboxes": 10}]})
    await core.create_namespaced_secret(
        NAMESPACE,
        k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="orchard-serve-keys"), string_data={"keys.json": keys_json}),
    )
    for document in manifests(server.hostname, str(server.port)):
        await k8s_utils.create_from_dict(api, document, namespace=NAMESPACE)
    print("applied serve.yaml", flush=True)
    url = f"http://127.0.0.1:{PORT}"
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        while True:
            try:
                if (await http.get("/health")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() - started > 300:
                pods = await core.list_namespaced_pod(NAMESPACE)
                raise SystemExit(f"the service never answered: {[p.status.phase for p in pods.items]}")
            await anyio.sleep(1)
        print(f"service healthy after {time.monotonic() - started:.1f}s", flush=True)
        refused = await http.get("/sandboxes", headers={"X-API-Key": "wrong"})
        assert refused.status_code == 403, refused.text
    adapter = oa.get_adapter("remote", url=url, api_key=key)
    try:
        t = time.monotonic()
        sandbox = await adapter.create(oa.SandboxSpec(image=os.environ.get("ORCHARD_K8S_IMAGE"), ttl=300))
        print(f"sandbox {sandbox.id} ready in {time.monotonic() - t:.1f}s", flush=True)
        pods = await core.list_namespaced_pod(NAMESPACE, label_selector="orchard.serve.id")
        assert len(pods.items) == 1, [p.metadata.name for p in pods.items]
        result = await sandbox.exec("echo hello from $(hostname); exit 3")
        assert result.exit_code == 3 and result.stdout.startswith(b"hello from "), result
        await sandbox.write_file("note.txt", b"\x00\x01payload")
        assert await sandbox.read_file("note.txt") == b"\x00\x01payload"
        latencies = []
        for _ in range(20):
            t = time.perf_counter()
            assert (await sandbox.exec("true")).exit_code == 0
            latencies.append(time.perf_counter() - t)
        latencies.sort()
        print(f"exec round trip via the in-cluster service: p50 {latencies[10] * 1000:.1f} ms", flush=True)
        await sandbox.close()
    finally:
        await adapter.close()
    deadline = time.monotonic() + 120
    while (left := await core.list_namespaced_pod(NAMESPACE, label_selector="orchard.serve.id")).items:
        if time.monotonic() > deadline:
            raise SystemExit(f"sandbox pods left: {[p.metadata.name for p in left.items]}")
        await anyio.sleep(1)
    # The Deployment goes before the cluster does: its ReplicaSet would remake the pod that
    # the cluster's teardown deletes.
    await k8s.AppsV1Api(api).delete_namespaced_deployment("orchard-serve", NAMESPACE)
    deadline = time.monotonic() + 120
    selector = "app.kubernetes.io/name=orchard-serve"
    while (left := await core.list_namespaced_pod(NAMESPACE, label_selector=selector)).items:
        if time.monotonic() > deadline:
            raise SystemExit(f"the service's pod did not end: {[p.metadata.name for p in left.items]}")
        await anyio.sleep(1)
    print("OK: created, ran, moved a file, deleted through the in-cluster service; no sandbox pod left")
    await api.close()


if __name__ == "__main__":
    anyio.run(main)
    sys.exit(0)

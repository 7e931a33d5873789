"""The conformance suite runs against every backend by name: local always (once per
isolation mode: bubblewrap and the unshare fallback), docker when a daemon answers,
kubernetes when a cluster is configured (ORCHARD_K8S_TEST_CONTEXT or KUBECONFIG)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable

import pytest

import orchard_async as oa
from orchard_async.capabilities import Doctor, facts_of
from tests.conftest import backend_missing, cluster_configured, docker_unready

BACKENDS = {
    "local-bwrap": {"isolation": "bwrap"},
    "local-unshare": {"isolation": "unshare"},
    "docker": {"image": os.environ.get("ORCHARD_DOCKER_TEST_IMAGE", "orchard/busybox:test")},
    "kubernetes": {
        "image": os.environ.get("ORCHARD_K8S_TEST_IMAGE", "local/busybox:1"),
        "namespace": os.environ.get("ORCHARD_K8S_TEST_NAMESPACE", "orchard-test"),
        "context": os.environ.get("ORCHARD_K8S_TEST_CONTEXT"),
    },
}


def _wanted(name: str) -> bool:
    selected = os.environ.get("ORCHARD_TEST_BACKENDS")
    return selected is None or name in selected.split(",") or adapter_name(name) in selected.split(",")


def adapter_name(backend: str) -> str:
    """local-bwrap and local-unshare are the local adapter in one isolation mode each."""
    return backend.partition("-")[0]


@pytest.fixture(params=[name for name in BACKENDS if _wanted(name)])
async def make_adapter(request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., oa.Adapter]]:
    """A factory of adapters for one backend; every adapter made is closed at the end and
    must have destroyed everything it created."""
    backend = request.param
    name = adapter_name(backend)
    if name == "kubernetes" and not cluster_configured():
        pytest.skip("no Kubernetes cluster configured (KUBECONFIG, ~/.kube/config or ORCHARD_K8S_TEST_CONTEXT)")
    made: list[oa.Adapter] = []

    def make(**options: object) -> oa.Adapter:
        try:
            adapter = oa.get_adapter(name, **{**BACKENDS[backend], **options})
        except (oa.AdapterUnavailable, oa.ConfigError) as exc:  # ConfigError: an isolation mode this host lacks
            backend_missing(f"{backend}: {exc}")
        made.append(adapter)
        return adapter

    adapter = make()
    if name == "docker":  # a daemon that answers is not enough: the test image must be built
        if reason := await docker_unready(facts_of(adapter).image):
            backend_missing(reason)
    if isinstance(adapter, Doctor):
        try:
            await adapter.doctor()
        except oa.OrchardError as exc:
            backend_missing(f"{backend}: {exc}")
    yield make
    for adapter in made:
        await adapter.close()
        assert await adapter.list_owned() == []


@pytest.fixture
async def sandbox(make_adapter: Callable[..., oa.Adapter]) -> AsyncIterator[oa.Sandbox]:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        yield box
    finally:
        await box.close()

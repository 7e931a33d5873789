"""An adapter's lifetime: held as ``async with adapter`` (or closed with ``close()``), it
ends every sandbox it made and leaves no background task running (protocols.py)."""

from __future__ import annotations

import asyncio

import pytest

import orchard_async as oa
from orchard_async.types import ExitReason


@pytest.mark.parametrize("held", ["async with", "close()"])
async def test_an_adapter_ends_its_sandboxes_and_its_background_work(make_adapter, held: str) -> None:
    before = set(asyncio.all_tasks())
    adapter = make_adapter()
    if held == "async with":
        async with adapter as entered:
            assert entered is adapter
            box = await adapter.create(oa.SandboxSpec(ttl=120))
            assert (await box.exec("echo hi")).text == "hi\n"
            assert box.id in await adapter.list_owned()
    else:
        box = await adapter.create(oa.SandboxSpec(ttl=120))
        assert (await box.exec("echo hi")).text == "hi\n"
        await adapter.close()
    assert await adapter.list_owned() == []
    assert (await box.exec("true")).reason is ExitReason.SANDBOX_LOST
    leftover = set(asyncio.all_tasks()) - before
    assert not leftover, leftover


async def gpus_here(adapter: oa.Adapter) -> int:
    """The GPUs this backend could give a sandbox (what decides whether gpus=1 must be refused)."""
    if adapter.name == "docker":
        info = await adapter.api.info()  # type: ignore[attr-defined]
        devices = [d for d in info.get("DiscoveredDevices") or [] if "nvidia.com/gpu" in str(d.get("ID"))]
        return len(devices) or (1 if "nvidia" in (info.get("Runtimes") or {}) else 0)
    if adapter.name == "kubernetes":
        from orchard_async.adapters.kubernetes.manifests import gpus_of

        nodes = await adapter.api.request("GET", "/api/v1/nodes", what="nodes")  # type: ignore[attr-defined]
        return max((gpus_of(node) for node in nodes["items"]), default=0)
    return 0  # local: no GPU is ever passed through


async def test_a_spec_asking_for_a_gpu_the_backend_lacks_is_refused_in_one_line(make_adapter) -> None:
    """Never a silent CPU-only sandbox: refused at create, before anything is made."""
    adapter = make_adapter()
    if await gpus_here(adapter):
        pytest.skip(f"{adapter.name} has a GPU here: nothing to refuse")
    with pytest.raises(oa.ConfigError, match="gpus=1") as caught:
        await adapter.create(oa.SandboxSpec(ttl=60, gpus=1))
    assert "\n" not in str(caught.value)
    assert await adapter.list_owned() == []

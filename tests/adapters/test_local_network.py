"""What the local adapter refuses to switch, in one line each: a sandbox created with the
host's network (network="on" shares the host's namespace: a filter there would be the host's),
and one without isolation. Switching itself: tests/conformance/test_network.py."""

from __future__ import annotations

import pytest

import orchard_async as oa
from orchard_async.adapters.local import LocalAdapter


async def test_a_sandbox_on_the_hosts_network_is_not_switched(tmp_path) -> None:
    async with LocalAdapter(root=tmp_path) as adapter:
        box = await adapter.create(oa.SandboxSpec(network="on", ttl=60))
        async with box:
            assert (await box.get_network()).mode == "enabled"  # type: ignore[attr-defined]
            with pytest.raises(oa.ConfigError, match="create it with network='none'") as refused:
                await box.set_network("restricted")  # type: ignore[attr-defined]
            assert "\n" not in str(refused.value)
            assert (await box.get_network()).revision == 0  # type: ignore[attr-defined]


async def test_a_sandbox_without_isolation_is_not_switched(tmp_path) -> None:
    async with LocalAdapter(root=tmp_path, isolation="none") as adapter:
        box = await adapter.create(oa.SandboxSpec(network="on", ttl=60))
        async with box:
            with pytest.raises(oa.ConfigError, match="without isolation is on the host's network"):
                await box.set_network("restricted")  # type: ignore[attr-defined]

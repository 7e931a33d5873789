"""``SandboxSpec.switch_users``: a sandbox that asks may switch to another user of its image
(Harbor's tasks run their agent as a non-root user), and gains nothing else; one that does
not ask cannot switch on a container adapter, whose root has no capability at all."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import orchard_async as oa
from orchard_async.capabilities import facts_of

SWITCH = "su -s /bin/sh nobody -c 'id -u; grep CapEff /proc/self/status' 2>&1; grep CapEff /proc/self/status"
SETUID_SETGID = "00000000000000c0"  # CAP_SETGID (6) and CAP_SETUID (7), nothing else


async def test_a_sandbox_that_asks_can_switch_users_and_gains_nothing_else(
    make_adapter: Callable[..., oa.Adapter],
) -> None:
    adapter = make_adapter()
    if facts_of(adapter).image is None:
        pytest.skip("local: the sandbox runs as one unprivileged user, which every phase runs as")
    async with await adapter.create(oa.SandboxSpec(ttl=120, switch_users=True)) as box:
        result = await box.exec(SWITCH)
        uid, _, switched, _, root = result.text.split()
        assert uid == "65534", result.text  # nobody's: the switch happened
        assert (switched, root) == ("0000000000000000", SETUID_SETGID), result.text


async def test_without_asking_a_container_sandbox_cannot_switch(make_adapter: Callable[..., oa.Adapter]) -> None:
    adapter = make_adapter()
    if facts_of(adapter).image is None:
        return  # local: the sandbox is one unprivileged user already (nothing to switch to or from)
    async with await adapter.create(oa.SandboxSpec(ttl=120)) as box:
        result = await box.exec("su -s /bin/sh nobody -c 'id -u' 2>&1")
        assert not result.ok and "65534" not in result.text.split(), result.text

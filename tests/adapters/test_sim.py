"""The sim adapter keeps the contract's one meaning of ``exec(timeout=...)`` (protocols.py)."""

from __future__ import annotations

import inspect

import orchard_async as oa
from orchard_async.adapters.sim import SimAdapter, SimSandbox
from orchard_async.types import ExitReason


async def test_exec_timeouts_mean_what_the_contract_says() -> None:
    assert inspect.signature(SimSandbox.exec).parameters["timeout"].default == oa.DEFAULT_EXEC_TIMEOUT
    async with SimAdapter(exec_hang_rate=1.0) as adapter:  # every command hangs
        box = await adapter.create(oa.SandboxSpec(ttl=0.3))
        assert (await box.exec("true", timeout=0.05)).reason is ExitReason.TIMEOUT
        # no limit of its own: it runs until the sandbox ends (here its TTL)
        assert (await box.exec("true", timeout=None)).reason is ExitReason.SANDBOX_LOST
    assert await adapter.list_owned() == []

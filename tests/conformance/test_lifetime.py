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

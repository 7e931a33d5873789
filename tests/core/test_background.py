"""An adapter's background work (orchard_async.kit.background): hosted in the caller's task
group under ``async with``, in a host task otherwise, and gone after ``close`` either way."""

from __future__ import annotations

import asyncio
import logging

import anyio
import pytest

from orchard_async.kit.background import Background, BackgroundOwner


class Owner(BackgroundOwner):
    """An adapter-shaped owner: one endless task and one that finishes its own work."""

    def __init__(self) -> None:
        self._background = Background()
        self.closed = 0
        self.finished_handshake = False

    def start(self) -> None:
        self._background.start_soon(anyio.sleep_forever)

        async def handshake() -> None:  # like a websocket's bounded close: waited for, not cancelled
            await anyio.sleep(0.05)
            self.finished_handshake = True

        self._background.start_soon(handshake, cancel_on_close=False)

    async def close(self) -> None:
        self.closed += 1
        await self._background.close()


async def test_async_with_runs_the_work_in_the_callers_task_group_and_ends_it() -> None:
    before = set(asyncio.all_tasks())
    async with Owner() as owner:
        owner.start()
        await anyio.sleep(0.01)
        assert len(set(asyncio.all_tasks()) - before) == 2  # the two tasks, no host task
    assert owner.closed == 1 and owner.finished_handshake
    assert set(asyncio.all_tasks()) == before


async def test_without_async_with_close_ends_the_host_and_the_owner_can_start_again() -> None:
    before = set(asyncio.all_tasks())
    owner = Owner()
    for _ in range(2):
        owner.start()
        await anyio.sleep(0.01)
        assert len(set(asyncio.all_tasks()) - before) == 3  # the two tasks and their host
        await owner.close()
        assert owner.finished_handshake
        assert set(asyncio.all_tasks()) == before
        owner.finished_handshake = False


async def test_the_callers_error_passes_through_unwrapped_and_a_failing_task_is_only_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken() -> None:
        raise KeyError("a bug in a background task")

    with pytest.raises(ValueError, match="the caller's own"):
        async with Owner() as owner:
            owner._background.start_soon(broken)
            await anyio.sleep(0.01)  # the failing task does not cancel this block
            raise ValueError("the caller's own error")
    assert owner.closed == 1
    assert any("a bug in a background task" in (r.exc_text or "") for r in caplog.records if r.levelno == logging.ERROR)


async def test_cancelling_one_task_leaves_the_others() -> None:
    owner = Owner()
    ran = anyio.Event()
    scope = owner._background.start_soon(anyio.sleep_forever)

    async def other() -> None:
        await anyio.sleep(0.02)
        ran.set()

    owner._background.start_soon(other)
    scope.cancel()
    with anyio.fail_after(5):
        await ran.wait()
    await owner.close()

"""The work an adapter does beside its callers (a stream's reader, the keepalive heartbeat,
the pod watch, deletion retries), owned in one anyio task group.

``async with adapter:`` is the way to hold an adapter: ``__aenter__`` opens the task group in
the caller's task, and ``__aexit__`` closes the adapter (its sandboxes, its connections),
cancels what still runs and waits for it, as anyio expects of anything that starts tasks.

Many callers hold an adapter without ``async with`` (made, used, and ``close()``d later,
perhaps from another task: a test fixture, a service's lifespan). An adapter has no task of
its own to host a task group then, so the first background task starts one host task whose
only job is to hold the same kind of task group until ``close()``. Either way ``close()``
cancels the background work, waits for it to finish, and leaves nothing running; the adapter
may be used again afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

log = logging.getLogger(__name__)

Work = Callable[..., Awaitable[Any]]


class Background:
    """A task group for an adapter's background tasks (see the module docstring)."""

    def __init__(self) -> None:
        self._group: anyio.abc.TaskGroup | None = None  # entered by ``async with``
        self._host: asyncio.Task[None] | None = None  # hosts a task group when nobody entered one
        self._hosted: anyio.abc.ObjectSendStream[Work] | None = None
        self._running: dict[anyio.CancelScope, bool] = {}  # each task's scope: cancelled by close?
        self._idle: anyio.Event | None = None  # set when the last task has finished

    async def __aenter__(self) -> Background:
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        return self

    async def __aexit__(self, *exc: object) -> None:
        group, self._group = self._group, None
        try:
            await self.close()
        finally:
            if group is not None:
                group.cancel_scope.cancel()
                # Not handed the body's exception: the task group would wrap it in an
                # ExceptionGroup, and the caller's own error must reach the caller as it was.
                await group.__aexit__(None, None, None)

    def start_soon(self, function: Work, *args: Any, cancel_on_close: bool = True) -> anyio.CancelScope:
        """Run ``function(*args)`` in the background; the returned scope cancels it alone.
        ``close`` cancels it (unless ``cancel_on_close`` is False: work that ends by itself,
        such as a bounded close handshake, is waited for instead) and waits for it. An
        exception it raises is logged: one failing task must not cancel the adapter's
        caller, who shares the task group."""
        scope = anyio.CancelScope()
        if not self._running:
            self._idle = anyio.Event()
        self._running[scope] = cancel_on_close

        async def run() -> None:
            try:
                with scope:
                    await function(*args)
            except Exception:  # noqa: BLE001 - logged, see above
                log.exception("background task %s failed", getattr(function, "__qualname__", function))
            finally:
                del self._running[scope]
                if not self._running and self._idle is not None:
                    self._idle.set()

        if self._group is not None:
            self._group.start_soon(run)
        else:
            self._hosted_group().send_nowait(run)
        return scope

    def _hosted_group(self) -> anyio.abc.ObjectSendStream[Work]:
        """The host task's inbox, starting the host on first use."""
        if self._hosted is None:
            send, receive = anyio.create_memory_object_stream[Work](max_buffer_size=math.inf)

            async def host() -> None:
                async with receive, anyio.create_task_group() as group:
                    async for work in receive:
                        group.start_soon(work)

            self._hosted = send
            self._host = asyncio.get_running_loop().create_task(host())
        return self._hosted

    async def close(self) -> None:
        """Cancel the background work (but what ends by itself), wait until all of it has
        finished, and stop the host task if there is one."""
        with anyio.CancelScope(shield=True):
            for scope, cancel in list(self._running.items()):
                if cancel:
                    scope.cancel()
            if self._running and self._idle is not None:
                await self._idle.wait()
            host, hosted, self._host, self._hosted = self._host, self._hosted, None, None
            if hosted is not None:
                hosted.close()  # the host's loop ends, and with nothing running its task group exits
            if host is not None:
                await asyncio.wait({host})


class BackgroundOwner:
    """``async with`` for an adapter that keeps its background work in ``self._background``
    and ends everything in ``close()`` (which also calls ``self._background.close()``)."""

    _background: Background

    async def close(self) -> None: ...

    async def __aenter__(self) -> Any:
        await self._background.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close()
        finally:
            await self._background.__aexit__(*exc)

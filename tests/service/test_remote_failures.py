"""The remote adapter when the service fails under it: the library's errors, never a raw one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

import orchard_async as oa


@pytest.fixture(params=["error", "hang-up"])
async def broken_service(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, list[str]]]:
    """A service that accepts a create, then fails every later call: a 500 (not retried), or
    the connection closed without an answer (a service killed mid-call)."""
    calls: list[str] = []
    hang_up = request.param == "hang-up"

    async def create(request: web.Request) -> web.Response:
        calls.append("create")
        body = await request.json()
        return web.json_response({"sandbox_id": body["sandbox_id"], "status": "pending"})

    async def fail(request: web.Request) -> web.Response:
        calls.append(request.method)
        if hang_up:
            request.transport.close()
        return web.json_response({"detail": "broken"}, status=500)

    app = web.Application()
    app.router.add_post("/sandboxes", create)
    app.router.add_get("/sandboxes/{id}/wait", fail)
    app.router.add_delete("/sandboxes/{id}", fail)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", calls
    await runner.cleanup()


async def test_a_create_whose_wait_and_cleanup_fail_is_create_failed(broken_service: tuple[str, list[str]]) -> None:
    url, calls = broken_service
    adapter = oa.get_adapter("remote", url=url, retry_for=1.0)
    try:
        with pytest.raises(oa.CreateFailed):
            await adapter.create(oa.SandboxSpec(image="orchard/busybox:test"))
        assert calls[:2] == ["create", "GET"] and "DELETE" in calls  # cleanup tried; its failure did not win
    finally:
        await adapter.close()

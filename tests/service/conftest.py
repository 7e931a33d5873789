"""A running service per test: ``create_app`` over a real adapter, on a real TCP port of the
loopback (clients see exactly what they would see in production: status lines, headers,
hung-up connections)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

import orchard_async as oa
from orchard_async.apps.serve import KeyStore, create_app, hash_key, load_keys
from tests.conftest import backend_missing, docker_unready

TEST_IMAGE = "orchard/busybox:test"  # what the contract tests create, on docker too
KEY_A, KEY_B = "key-of-team-a-0123456789", "key-of-team-b-0123456789"


class Service:
    def __init__(self, url: str, app: web.Application, adapter: oa.Adapter):
        self.url = url
        self.app = app
        self.adapter = adapter

    def client(self, key: str | None = None, **options: Any) -> httpx.AsyncClient:
        headers = {"X-API-Key": key} if key else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=60, **options)


def write_keys(path: Path, **quotas: Any) -> Path:
    entries = [
        {"name": "team-a", "sha256": hash_key(KEY_A), **quotas},
        {"name": "team-b", "sha256": hash_key(KEY_B)},
    ]
    path.write_text(json.dumps({"keys": entries}))
    return path


@pytest.fixture
async def start_service(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Service]]]:
    runners: list[web.AppRunner] = []

    async def start(
        adapter: str = "local",
        *,
        adapter_options: dict | None = None,
        keys: bool = False,
        quotas: dict | None = None,
        **options: Any,
    ) -> Service:
        made = oa.get_adapter(adapter, **(adapter_options or {}))
        store = KeyStore(load_keys(write_keys(tmp_path / "keys.json", **(quotas or {})))) if keys else None
        app = create_app(made, keys=store, **options)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return Service(f"http://127.0.0.1:{port}", app, made)

    yield start
    for runner in runners:
        await runner.cleanup()


# The backends behind the contract tests: local in the default run, docker in the soak run too
# (a daemon must answer; skipped without one, failed in CI). Both hold the same tests.
@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.soak)])
async def service(request: pytest.FixtureRequest, start_service: Callable[..., Awaitable[Service]]) -> Service:
    if request.param == "docker" and (reason := await docker_unready(TEST_IMAGE)):
        backend_missing(reason)
    try:
        return await start_service(request.param)
    except oa.AdapterUnavailable as exc:
        backend_missing(f"{request.param}: {exc}")


@pytest.fixture
async def client(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with service.client() as http:
        yield http


async def make_sandbox(http: httpx.AsyncClient, **body: Any) -> str:
    """A ready sandbox, made the way Orchard's client makes one: create, then wait."""
    created = await http.post("/sandboxes", json={"image": TEST_IMAGE, "block_network": True, **body})
    assert created.status_code == 200, created.text
    sandbox_id = created.json()["sandbox_id"]
    ready = await http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 60})
    assert ready.status_code == 200 and ready.json()["ready"] is True, ready.text
    return sandbox_id

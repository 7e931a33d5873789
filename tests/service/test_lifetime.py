"""Lifetime and observability: the idle limit (renewed by heartbeats and calls), the TTL,
``/metrics`` in Prometheus's text format, and the library's demo through the service."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import anyio
import httpx

import orchard_async as oa
from orchard_async import runtime
from orchard_async.apps import cli
from orchard_async.apps.serve import app
from tests.service.conftest import Service, make_sandbox
from tests.service.test_contract import exec_body


async def wait_until_removed(http: httpx.AsyncClient, sandbox_id: str) -> None:
    """Polls as a client would (GET answers 404 once the reaper removed it)."""
    with anyio.fail_after(60):
        while (await http.get(f"/sandboxes/{sandbox_id}")).status_code != 404:  # noqa: ASYNC110 - polling a server
            await anyio.sleep(0.05)


async def test_idle_sandboxes_are_removed_and_heartbeats_keep_them(start_service) -> None:
    service = await start_service(idle_timeout=1.0, reap_interval=0.1)
    async with service.client() as http:
        idle = await make_sandbox(http)
        kept = await make_sandbox(http)
        async with anyio.create_task_group() as tg:

            async def beat() -> None:
                while True:
                    await http.post(f"/sandboxes/{kept}/heartbeat")
                    await anyio.sleep(0.2)

            tg.start_soon(beat)
            await wait_until_removed(http, idle)
            tg.cancel_scope.cancel()
        assert (await http.get(f"/sandboxes/{idle}")).status_code == 404
        assert (await http.post(f"/sandboxes/{kept}/exec", json=exec_body("echo alive"))).json()["stdout"] == "alive\n"
        metrics = (await http.get("/metrics")).text
        assert 'orchard_serve_deletes_total{key="local",reason="idle"} 1' in metrics


async def test_sandboxes_end_at_their_ttl(start_service) -> None:
    service = await start_service(reap_interval=0.1)
    async with service.client() as http:
        short = await make_sandbox(http, timeout=1)
        await wait_until_removed(http, short)
        assert 'reason="ttl"} 1' in (await http.get("/metrics")).text


async def test_metrics_format(service: Service) -> None:
    async with service.client() as http:
        sandbox_id = await make_sandbox(http)
        for _ in range(3):
            await http.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("true"))
        await http.get("/sandboxes/unknown")
        response = await http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'orchard_serve_live_sandboxes{key="local"} 1' in text
    assert 'orchard_serve_creates_total{key="local"} 1' in text
    assert 'orchard_serve_errors_total{reason="unknown_sandbox"} 1' in text
    assert 'orchard_serve_exec_seconds_bucket{le="+Inf"} 3' in text and "orchard_serve_exec_seconds_count 3" in text
    for line in text.splitlines():  # every sample line: name{labels} value
        assert line.startswith("#") or re.fullmatch(r"[a-z_]+(\{[^}]*\})? [0-9.e+-]+", line), line


async def test_the_demo_through_the_service(service: Service, monkeypatch, tmp_path: Path) -> None:
    """`orchard-async demo --adapter remote`: the bundled SWE tasks, every sandbox a service's."""
    monkeypatch.setitem(runtime.ADAPTERS, "remote", "orchard_async.adapters.remote:RemoteAdapter")
    argv = ["demo", "--adapter", "remote", "--adapter-options", json.dumps({"url": service.url}),
            "--episodes", "4", "--concurrency", "4", "--out", str(tmp_path / "demo")]  # fmt: skip
    assert await anyio.to_thread.run_sync(cli.main, argv) == 0
    rewards = [episode.reward for episode in oa.read_trajectories(tmp_path / "demo" / "trajectories.jsonl")]
    assert rewards == [1.0] * 4


async def test_a_sandbox_half_made_by_a_killed_run_goes_at_the_second_reap(
    start_service, monkeypatch, tmp_path
) -> None:
    """A dir the killed run made without its lease yet is young at the restart's first reap
    (left alone: it might be being made); the second reap, once it is old, removes it."""
    root = tmp_path / "sandboxes"
    half_made = root / "lo-halfmade0000000"
    half_made.mkdir(parents=True)
    made_at = time.time() - 56  # the first reap sees it at ~56 s (kept), the second at ~61 s+
    os.utime(half_made, (made_at, made_at))
    monkeypatch.setattr(app, "SECOND_REAP_AFTER", 5.0)
    await start_service("local", adapter_options={"root": str(root)})
    assert half_made.exists()
    for _ in range(150):  # up to 30 s
        if not half_made.exists():
            break
        await anyio.sleep(0.2)
    assert not half_made.exists()

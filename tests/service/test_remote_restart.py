"""The remote adapter across a ``kill -9`` of its service: a create whose answer was lost retries
with the same id (never a second sandbox), and an exec whose answer was lost is never run a
second time by the restarted service. Real service processes, a proxy that loses one answer."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import anyio
import httpx
import pytest

import orchard_async as oa
from orchard_async.bench.service import free_port
from tests.conftest import backend_missing, docker_unready
from tests.service.cutting_proxy import CuttingProxy
from tests.service.test_restart import IMAGE, Serve, containers

RETRY_FOR = 90.0  # the adapter's patience: a restart of the service on a loaded machine fits


async def listed(url: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        return (await http.get("/sandboxes")).json()["sandboxes"]


async def until_ready(url: str) -> str:
    """The id of the one sandbox the service holds, once it is ready (the create landed)."""
    with anyio.fail_after(120):
        while True:
            boxes = await listed(url)
            if boxes and boxes[0]["status"] == "ready":
                return boxes[0]["sandbox_id"]
            await anyio.sleep(0.1)


async def restarted(serve: Serve, tmp_path: Path, name: str, port: int, *extra: str, adapter: str) -> Serve:
    serve.kill()
    return await anyio.to_thread.run_sync(lambda: Serve(tmp_path, name, "--port", str(port), *extra, adapter=adapter))


async def create_through_a_kill(
    tmp_path: Path, adapter: str, *extra: str, cut: bytes = b"POST /sandboxes "
) -> tuple[Serve, oa.Sandbox, str, CuttingProxy, oa.Adapter]:
    """Create through the proxy; the create (or its ``/wait``: ``cut``) lands, its answer is
    lost, the service is killed once the sandbox is ready and started again: the adapter's
    retry must end with one sandbox, under the id it sent."""
    name, port = f"test-cut-{uuid.uuid4().hex[:10]}", free_port()
    first = Serve(tmp_path, name, "--port", str(port), *extra, adapter=adapter)
    proxy = await CuttingProxy(port).start()
    remote = oa.get_adapter("remote", url=proxy.url, retry_for=RETRY_FOR)
    try:
        proxy.cut(cut)
        async with anyio.create_task_group() as tg:
            made: list[oa.Sandbox] = []

            async def create() -> None:
                made.append(await remote.create(oa.SandboxSpec(image=IMAGE, ttl=600)))

            tg.start_soon(create)
            await proxy.cut_done.wait()
            landed = await until_ready(first.url)
            second = await restarted(first, tmp_path, name, port, *extra, adapter=adapter)
            proxy.resume()
        return second, made[0], landed, proxy, remote
    except BaseException:
        first.stop()
        await proxy.close()
        await remote.close()
        raise


@pytest.mark.parametrize("cut", [b"POST /sandboxes ", b"GET /sandboxes/"], ids=["create", "wait"])
@pytest.mark.soak  # ~15 s each: a service killed and restarted twice; the default run keeps the 5-minute budget
async def test_a_create_whose_answer_was_lost_in_a_kill_makes_one_sandbox_local(tmp_path: Path, cut: bytes) -> None:
    root = tmp_path / "sandboxes"
    root.mkdir()
    options = ("--adapter-options", json.dumps({"root": str(root)}))
    second, sandbox, landed, proxy, remote = await create_through_a_kill(tmp_path, "local", *options, cut=cut)
    try:
        # local cannot re-adopt: the landed sandbox died with the service and was reaped; the
        # retry (same id) made the one sandbox there is now, under the id the caller holds
        assert sandbox.id == landed
        assert [box["sandbox_id"] for box in await listed(second.url)] == [landed]
        assert len([path for path in root.iterdir() if path.is_dir()]) == 1
        result = await sandbox.exec(f"echo {sandbox.id}")
        assert result.stdout == f"{sandbox.id}\n".encode(), result
        await sandbox.close()
        assert await listed(second.url) == []
    finally:
        await remote.close()
        await proxy.close()
        second.stop()


@pytest.mark.soak
async def test_a_create_and_an_exec_whose_answers_were_lost_in_kills_docker(tmp_path: Path) -> None:
    if reason := await docker_unready(IMAGE):
        backend_missing(reason)
    second, sandbox, landed, proxy, remote = await create_through_a_kill(tmp_path, "docker")
    name = second.process.args[second.process.args.index("--name") + 1]
    port = int(second.url.rsplit(":", 1)[1])
    third = None
    try:
        # docker re-adopts: the retry got the very sandbox the lost answer named, and no other
        assert sandbox.id == landed
        assert [box["sandbox_id"] for box in await listed(second.url)] == [landed]
        assert len(containers(name)) == 1
        assert (await sandbox.exec("echo one >> /workspace/runs")).ok
        # an exec lands and starts, its answer is lost, the service dies under it: the retry
        # reaches the restarted service, which must not run the command again
        proxy.cut(b"POST /sandboxes/")
        async with anyio.create_task_group() as tg:
            outcome: list[oa.ExecResult] = []

            async def run() -> None:
                outcome.append(await sandbox.exec("echo two >> /workspace/runs; sleep 5", timeout=60))

            tg.start_soon(run)
            await proxy.cut_done.wait()
            await asyncio.sleep(1.0)  # it is running (`echo two` done) when the service dies
            third = await restarted(second, tmp_path, name, port, adapter="docker")
            proxy.resume()
        assert outcome[0].reason is oa.ExitReason.INFRA_ERROR, outcome[0]
        assert b"service restarted" in outcome[0].stderr
        runs = await sandbox.exec("cat /workspace/runs")
        assert runs.stdout == b"one\ntwo\n", runs
        await sandbox.close()
        with anyio.fail_after(60):  # the container's removal runs after the DELETE's answer
            while containers(name):  # noqa: ASYNC110 - polling the daemon
                await anyio.sleep(0.2)
    finally:
        await remote.close()
        await proxy.close()
        (third or second).stop()

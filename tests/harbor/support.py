"""Running Harbor fixture tasks through the recipe, for the tests of this folder."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

import orchard_async as oa
from orchard_async.recipes import harbor
from tests.conftest import backend_missing, cluster_configured, require_docker

HERE = Path(__file__).resolve().parent
TASKS = HERE / "tasks"
BAD = HERE / "bad"
NETWORK = HERE / "network"
TEST_IMAGE = "orchard/python:test"  # `orchard-async images build orchard/python:test`
# The fixtures name public images; no registry is reachable, so local test images stand in.
IMAGE_MAP = {"ubuntu:24.04": TEST_IMAGE, "python:3.12-slim": TEST_IMAGE}
OPTIONS = {"image_map": IMAGE_MAP}
PAYLOAD = b"allowlisted-payload"  # what payload_server answers
FIXTURE_URL = "HARBOR_FIXTURE_URL"  # the server the network fixtures fetch from (their task.toml)


class ScriptPolicy:
    """Runs fixed commands (as the agent: the task's user and workdir), then submits."""

    def __init__(self, commands: list[str], name: str = "script"):
        self.commands, self.name = commands, name

    async def act(self, observation: oa.Observation) -> oa.Action:
        if observation.step < len(self.commands):
            return oa.Action(command=observation.task.agent_command(self.commands[observation.step]))
        return oa.Action(kind="submit", command="submit")


def load(source: Path = TASKS, **options: Any) -> list[harbor.HarborTask]:
    return harbor.load_tasks(str(source), {**OPTIONS, **options})


async def run(tasks: list[Any], policy: Any, adapter: str, **adapter_options: Any) -> dict[str, oa.Trajectory]:
    found = {}
    async with oa.get_adapter(adapter, **adapter_options) as backend:
        async for trajectory in oa.rollout(tasks, policy, backend, concurrency=4, max_retries=0):
            found[trajectory.task_id] = trajectory
    return found


def ready(adapter: str) -> None:
    """Skip (fail in CI) where the adapter cannot run the fixtures; build their images on docker
    (on kubernetes also imported into the one-node cluster's containerd)."""
    if adapter == "local":
        return
    if adapter == "kubernetes" and not cluster_configured():
        backend_missing("no Kubernetes cluster configured (KUBECONFIG, ~/.kube/config or ORCHARD_K8S_TEST_CONTEXT)")
    require_docker(TEST_IMAGE)
    built = subprocess.run(
        [sys.executable, "-m", "orchard_async.apps.cli", "harbor", "build", str(TASKS), "--adapter", adapter,
         "--recipe-options",
         '{"image_map": {"ubuntu:24.04": "orchard/python:test", "python:3.12-slim": "orchard/python:test"}}'],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if built.returncode != 0:
        backend_missing(f"harbor build of the fixtures failed: {built.stderr.strip()[-300:]}")


async def run_groups(tasks: list[Any], policy: Any, adapter: str) -> list[oa.Trajectory]:
    """One episode per entry of ``tasks`` (group ``g`` is ``tasks[g]``), all at once; in group order."""
    found = []
    async with oa.get_adapter(adapter) as backend:
        async for trajectory in oa.rollout(tasks, policy, backend, n=len(tasks), concurrency=len(tasks), max_retries=0):
            found.append(trajectory)
    return sorted(found, key=lambda t: int(t.group_id.rsplit("/g", 1)[1]))


def run_sync(*args: Any, **kwargs: Any) -> dict[str, oa.Trajectory]:
    return anyio.run(lambda: run(*args, **kwargs))


def main_address() -> str | None:
    """This machine's own non-loopback IPv4 address (a UDP connect sends no packet)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


@contextmanager
def payload_server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def fixture_server() -> Iterator[str]:
    """``payload_server`` on this machine's own address, named by HARBOR_FIXTURE_URL in this
    process's environment while it runs: the no-network fixture must not reach it (its test
    scores 0 without the variable: an unset URL proves nothing)."""
    address = main_address()
    assert address is not None, "this machine has no non-loopback address to serve from"
    before = os.environ.get(FIXTURE_URL)
    with payload_server() as port:
        os.environ[FIXTURE_URL] = f"http://{address}:{port}/"
        try:
            yield os.environ[FIXTURE_URL]
        finally:
            if before is None:
                os.environ.pop(FIXTURE_URL, None)
            else:
                os.environ[FIXTURE_URL] = before

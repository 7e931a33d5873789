"""``DockerAdapter.attach`` and ``find_sandboxes``: a new shell session on a container made
with a reattach grace whose controller is gone (see orchard_async.kit.container_reattach)."""

from __future__ import annotations

import json
import time

import aiodocker
import anyio
from aiodocker.containers import DockerContainer

from orchard_async.adapters.docker import DockerAdapter
from orchard_async.errors import BackendUnavailable, CreateFailed, SandboxLost
from orchard_async.kit import labels as names
from orchard_async.kit.container_reattach import attach_check_command, wait_attachable
from orchard_async.kit.exec_streams import OutputStream
from orchard_async.kit.sandbox import ShellSandbox


async def _run_check(adapter: DockerAdapter, container: DockerContainer, name: str) -> bytes:
    try:
        output = OutputStream(await adapter._attach(container, attach_check_command(), "attach check", stdin=False))
    except CreateFailed as exc:
        raise SandboxLost(f"sandbox {name} cannot be attached to: {exc}") from None
    received = b""
    try:
        with anyio.fail_after(adapter.api_timeout):
            while True:
                received += await output.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        return received
    except TimeoutError:
        raise BackendUnavailable(f"the attach check of {name} did not finish in {adapter.api_timeout:.0f}s") from None
    finally:
        await output.aclose()


async def attach(adapter: DockerAdapter, name: str) -> ShellSandbox:
    """DockerAdapter.attach: a new shell session on a live container of reattach mode."""
    if name in adapter._live:
        return adapter._live[name]
    docker = await adapter._client()
    container = docker.containers.container(name)
    try:
        info = await adapter._call(f"inspect of {name}", container.show())
    except aiodocker.DockerError as exc:
        if exc.status == 404:
            raise SandboxLost(f"sandbox {name} is gone") from None
        raise
    labels = info["Config"].get("Labels") or {}
    if names.OWNER not in labels:
        raise SandboxLost(f"container {name} is not an orchard sandbox")
    expires_at = names.expiry(labels)
    if not info["State"].get("Running") or expires_at <= time.time():
        await adapter._remove(name)
        raise SandboxLost(f"sandbox {name} has ended (its TTL passed, or it had no controller for its grace)")
    if names.REATTACH not in labels:
        raise SandboxLost(f"sandbox {name} was made without a reattach grace: it ends with its controller")
    patience = adapter.keepalive + 5.0
    try:
        workdir = await wait_attachable(lambda: _run_check(adapter, container, name), name, patience)
    except SandboxLost:  # it takes no exec, or its timer is not on record: of no use to anyone
        await adapter._remove(name)
        raise
    try:
        client, relays = await adapter._open_shell(container, workdir, name)
    except BaseException:
        adapter._heartbeat.discard(name)
        raise
    return adapter._sandbox(container, name, client, relays, labels, expires_at)


async def find_sandboxes(adapter: DockerAdapter, match: dict[str, str]) -> dict[str, dict[str, str]]:
    """DockerAdapter.find_sandboxes: orchard containers with every label of ``match``, running
    or not yet removed (``attach`` removes those it cannot use, so their end is known)."""
    docker = await adapter._client()
    wanted = [names.OWNER, *(f"{key}={value}" for key, value in match.items())]
    filters = json.dumps({"label": wanted})
    containers = await adapter._call("container list", docker.containers.list(all=True, filters=filters))
    return {container["Names"][0].lstrip("/"): container["Labels"] or {} for container in containers}

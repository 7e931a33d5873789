"""Taking over a container made with a reattach grace whose controller is gone (see
orchard_async.kit.container_reattach): ``find_sandboxes`` lists them, ``adoptable`` checks one
and waits until its old session has ended; the adapter then opens its own shell on it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import aiodocker
import anyio
from aiodocker.containers import DockerContainer

from orchard_async.adapters.docker.api import DockerApi
from orchard_async.errors import BackendUnavailable, CreateFailed, SandboxLost
from orchard_async.kit import labels as names
from orchard_async.kit.container_reattach import attach_check_command, wait_attachable
from orchard_async.kit.exec_streams import OutputStream


class Adoptable(NamedTuple):
    """A live sandbox container free for a new session: what the adapter's sandbox is made of."""

    container: DockerContainer
    labels: dict[str, str]
    expires_at: float
    workdir: str


async def find_sandboxes(api: DockerApi, match: dict[str, str]) -> dict[str, dict[str, str]]:
    """Orchard containers with every label of ``match``, running or not yet removed
    (``adoptable`` removes those it cannot use, so their end is known): name -> labels."""
    containers = await api.list_containers([names.OWNER, *(f"{key}={value}" for key, value in match.items())])
    return {container["Names"][0].lstrip("/"): container["Labels"] or {} for container in containers}


async def _run_check(api: DockerApi, container: DockerContainer, name: str) -> bytes:
    try:
        output = OutputStream(await api.attach_exec(container, attach_check_command(), "attach check", stdin=False))
    except CreateFailed as exc:
        raise SandboxLost(f"sandbox {name} cannot be attached to: {exc}") from None
    received = b""
    try:
        with anyio.fail_after(api.timeout):
            while True:
                received += await output.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        return received
    except TimeoutError:
        raise BackendUnavailable(f"the attach check of {name} did not finish in {api.timeout:.0f}s") from None
    finally:
        await output.aclose()


async def adoptable(
    api: DockerApi, name: str, *, patience: float, remove: Callable[[str], Awaitable[object]]
) -> Adoptable:
    """Container ``name``, once its old session has ended (waiting up to ``patience`` seconds
    for that). SandboxLost when it ended or expired, or cannot take a new session (``remove``d
    then: of no use to anyone), or was made without a reattach grace; CreateFailed while
    another controller's session is alive."""
    container = await api.container(name)
    try:
        info = await api.call(f"inspect of {name}", container.show())
    except aiodocker.DockerError as exc:
        if exc.status == 404:
            raise SandboxLost(f"sandbox {name} is gone") from None
        raise
    labels = info["Config"].get("Labels") or {}
    if names.OWNER not in labels:
        raise SandboxLost(f"container {name} is not an orchard sandbox")
    expires_at = names.expiry(labels)
    if not info["State"].get("Running") or expires_at <= time.time():
        await remove(name)
        raise SandboxLost(f"sandbox {name} has ended (its TTL passed, or it had no controller for its grace)")
    if names.REATTACH not in labels:
        raise SandboxLost(f"sandbox {name} was made without a reattach grace: it ends with its controller")
    try:
        workdir = await wait_attachable(lambda: _run_check(api, container, name), name, patience)
    except SandboxLost:  # it takes no exec, or its timer is not on record
        await remove(name)
        raise
    return Adoptable(container, labels, expires_at, workdir)

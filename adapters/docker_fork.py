"""Forks on docker: ``snapshot`` commits a sandbox's container to a local image, a create with
``spec.snapshot`` starts a container from that image, ``drop_snapshot`` removes it.

* The image is the container's writable layer on top of its image (``docker commit``): the
  work dir, installed packages, everything but tmpfs mounts. The container is paused for the
  commit (the freezer cgroup; a few ms), so no half-written file is captured.
* It is tagged ``orchard/snapshot:<hex>`` and labelled with the run's lease labels (owner,
  run, controller, an expiry ``snapshot_ttl`` ahead): ``reap`` removes a dead run's
  snapshots like its containers, after the containers (a fork holds its image).
* A fork mounts a fresh tmpfs over the shell's control dir: the committed one holds the
  source shell's pid file, which would tell the fork's timer that a shell attached when
  none did (it would then live to its TTL instead of the attach grace).
* No registry is involved: a snapshot lives on the daemon that made it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING

import aiodocker

from orchard_async.errors import BackendUnavailable, ConfigError, SandboxLost
from orchard_async.kit import labels as names
from orchard_async.kit.container_shell import CTL_DIR, is_abandoned
from orchard_async.protocols import Sandbox

if TYPE_CHECKING:
    from orchard_async.adapters.docker import DockerAdapter

SNAPSHOT_REPO = "orchard/snapshot"
SNAPSHOT_LABEL = "orchard.snapshot"  # on a snapshot image (and so on its forks): the snapshot's tag
COMMIT_TIMEOUT = 300.0  # a commit writes the container's whole writable layer
DROP_TIMEOUT = 60.0


def snapshot_tmpfs() -> dict[str, str]:
    """The fork's extra mount: a clean control dir (see the module docstring)."""
    return {CTL_DIR: "mode=0700"}


def check_snapshot_id(snapshot_id: str) -> None:
    if not snapshot_id.startswith(f"{SNAPSHOT_REPO}:"):
        raise ConfigError(
            f"snapshot {snapshot_id!r} is not a docker snapshot id (adapter.snapshot() returns {SNAPSHOT_REPO}:<tag>)"
        )


async def snapshot(adapter: DockerAdapter, sandbox: Sandbox) -> str:
    """Commit the sandbox's container to ``orchard/snapshot:<hex>`` with the run's lease labels."""
    if adapter.config.read_only:
        raise ConfigError(
            "docker snapshots need a writable root: with read_only=True the work dir is a tmpfs, "
            "which a commit does not capture; set read_only=False to fork"
        )
    name = getattr(sandbox, "id", "")
    if name not in adapter._live:
        raise ConfigError(f"sandbox {name or sandbox!r} is not a live sandbox of this docker adapter")
    docker = await adapter._client()
    tag = uuid.uuid4().hex[:16]
    labels = {
        **names.lease_labels(
            owner=adapter.owner,
            run=adapter.run_id,
            expires_at=time.time() + adapter.config.snapshot_ttl,
            controller=adapter.controller,
        ),
        SNAPSHOT_LABEL: tag,
    }
    container = docker.containers.container(name)
    commit = container.commit(
        repository=SNAPSHOT_REPO,
        tag=tag,
        config=json.dumps({"Labels": labels}),  # type: ignore[arg-type]  # sent as the body
        pause=True,
    )
    try:
        await adapter._call(f"commit of {name}", commit, COMMIT_TIMEOUT)
    except aiodocker.DockerError as exc:
        # the commit may have made the image before failing: do not leave it behind
        await drop_snapshot(adapter, f"{SNAPSHOT_REPO}:{tag}", quiet=True)
        if exc.status == 404:
            raise SandboxLost(f"sandbox {name} is gone: nothing to snapshot") from None
        raise BackendUnavailable(f"the Docker daemon could not commit {name}: {exc.message}") from None
    adapter._snapshots.add(f"{SNAPSHOT_REPO}:{tag}")
    return f"{SNAPSHOT_REPO}:{tag}"


async def _delete_image(adapter: DockerAdapter, snapshot_id: str) -> bool:
    """Remove a snapshot image: True once it is gone, False while a container still uses it."""
    docker = await adapter._client()
    try:
        await adapter._call(f"removal of {snapshot_id}", docker.images.delete(snapshot_id), DROP_TIMEOUT)
    except aiodocker.DockerError as exc:
        if exc.status == 404:  # dropped already
            return True
        if exc.status == 409:  # a fork still holds it
            return False
        raise BackendUnavailable(f"the Docker daemon could not remove {snapshot_id}: {exc.message}") from None
    return True


async def drop_snapshot(adapter: DockerAdapter, snapshot_id: str, *, quiet: bool = False) -> None:
    """Remove the snapshot image and its layer (idempotent). One whose forks are still there
    cannot go yet: ConfigError (``quiet``: none); the adapter's ``close`` drops every snapshot
    it made that is still there, and ``reap`` gets them after a crash."""
    check_snapshot_id(snapshot_id)
    try:
        gone = await _delete_image(adapter, snapshot_id)
    except BackendUnavailable:
        if quiet:
            return
        raise
    if gone:
        adapter._snapshots.discard(snapshot_id)
    elif not quiet:
        raise ConfigError(f"snapshot {snapshot_id} is still used by a sandbox: close its forks first")


async def reap_snapshots(adapter: DockerAdapter, older_than: float) -> list[str]:
    """Snapshot images (anyone's) whose controller is dead or whose expiry passed ``older_than``
    seconds ago, removed; call after the containers (a fork keeps its image in use)."""
    docker = await adapter._client()
    filters = {"label": [names.OWNER, SNAPSHOT_LABEL]}
    images = await adapter._call("image list", docker.images.list(filters=filters))
    now = time.time()
    removed = []
    for image in images:
        labels = image.get("Labels") or {}
        alive = names.controller_alive(labels.get(names.CONTROLLER, ""))
        if not is_abandoned(labels, ended=False, controller_alive=alive, now=now, older_than=older_than):
            continue
        for snapshot_id in image.get("RepoTags") or []:
            if not snapshot_id.startswith(f"{SNAPSHOT_REPO}:") or snapshot_id in adapter._snapshots:
                continue
            try:
                if await _delete_image(adapter, snapshot_id):
                    removed.append(snapshot_id)
            except BackendUnavailable:
                pass  # the next reap tries again
    return removed

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

import aiodocker

from orchard_async.adapters.docker.api import DockerApi
from orchard_async.errors import BackendUnavailable, ConfigError, SandboxLost
from orchard_async.kit import labels as names
from orchard_async.kit.container_shell import CTL_DIR, is_abandoned

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


class Forks:
    """The snapshots one adapter made (``taken``: made and not dropped; the adapter's ``close``
    drops them, they belong to its run), on the daemon ``api`` reaches."""

    def __init__(self, api: DockerApi):
        self.api = api
        self.taken: set[str] = set()

    async def take(self, name: str, lease: dict[str, str]) -> str:
        """Commit container ``name`` to ``orchard/snapshot:<hex>`` labelled with ``lease`` (the
        run's lease labels, with the snapshot's own expiry)."""
        tag = uuid.uuid4().hex[:16]
        snapshot_id = f"{SNAPSHOT_REPO}:{tag}"
        container = await self.api.container(name)
        commit = container.commit(
            repository=SNAPSHOT_REPO,
            tag=tag,
            config=json.dumps({"Labels": {**lease, SNAPSHOT_LABEL: tag}}),  # type: ignore[arg-type]  # sent as the body
            pause=True,
        )
        try:
            await self.api.call(f"commit of {name}", commit, COMMIT_TIMEOUT)
        except aiodocker.DockerError as exc:
            # the commit may have made the image before failing: do not leave it behind
            await self.drop(snapshot_id, quiet=True)
            if exc.status == 404:
                raise SandboxLost(f"sandbox {name} is gone: nothing to snapshot") from None
            raise BackendUnavailable(f"the Docker daemon could not commit {name}: {exc.message}") from None
        self.taken.add(snapshot_id)
        return snapshot_id

    async def _delete_image(self, snapshot_id: str) -> bool:
        """Remove a snapshot image: True once it is gone, False while a container still uses it."""
        docker = await self.api.client()
        try:
            await self.api.call(f"removal of {snapshot_id}", docker.images.delete(snapshot_id), DROP_TIMEOUT)
        except aiodocker.DockerError as exc:
            if exc.status == 404:  # dropped already
                return True
            if exc.status == 409:  # a fork still holds it
                return False
            raise BackendUnavailable(f"the Docker daemon could not remove {snapshot_id}: {exc.message}") from None
        return True

    async def drop(self, snapshot_id: str, *, quiet: bool = False) -> None:
        """Remove the snapshot image and its layer (idempotent). One whose forks are still there
        cannot go yet: ConfigError (``quiet``: none); the adapter's ``close`` drops every snapshot
        it made that is still there, and ``reap`` gets them after a crash."""
        check_snapshot_id(snapshot_id)
        try:
            gone = await self._delete_image(snapshot_id)
        except BackendUnavailable:
            if quiet:
                return
            raise
        if gone:
            self.taken.discard(snapshot_id)
        elif not quiet:
            raise ConfigError(f"snapshot {snapshot_id} is still used by a sandbox: close its forks first")

    async def reap(self, older_than: float) -> list[str]:
        """Snapshot images (anyone's but this adapter's own) whose controller is dead or whose
        expiry passed ``older_than`` seconds ago, removed; call after the containers (a fork
        keeps its image in use)."""
        docker = await self.api.client()
        filters = {"label": [names.OWNER, SNAPSHOT_LABEL]}
        images = await self.api.call("image list", docker.images.list(filters=filters))
        now = time.time()
        removed = []
        for image in images:
            labels = image.get("Labels") or {}
            alive = names.controller_alive(labels.get(names.CONTROLLER, ""))
            if not is_abandoned(labels, ended=False, controller_alive=alive, now=now, older_than=older_than):
                continue
            for snapshot_id in image.get("RepoTags") or []:
                if not snapshot_id.startswith(f"{SNAPSHOT_REPO}:") or snapshot_id in self.taken:
                    continue
                try:
                    if await self._delete_image(snapshot_id):
                        removed.append(snapshot_id)
                except BackendUnavailable:
                    pass  # the next reap tries again
        return removed

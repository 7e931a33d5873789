"""Which snapshot method a kubernetes adapter uses, and the calls the adapter makes for forks
(snapshot.py says what each method captures): a containerd image where the controller reaches
the sandbox's node's containerd, else the tar of the work dir."""

from __future__ import annotations

from pathlib import Path

import anyio

from orchard_async.adapters.kubernetes import containerd_image as images
from orchard_async.adapters.kubernetes import snapshot as snaps
from orchard_async.adapters.kubernetes.config import KubernetesConfig
from orchard_async.adapters.kubernetes.watch import PodState
from orchard_async.errors import ConfigError
from orchard_async.protocols import Sandbox


class Forks:
    """The adapter's snapshot store and method; ``ctr`` is probed once, on first use."""

    def __init__(self, config: KubernetesConfig) -> None:
        if config.snapshot_registry:
            raise ConfigError(
                "snapshot_registry is set, but pushing kubernetes snapshots to a registry is not built: "
                "unset it (forks then import into the node's containerd on a one-node cluster, "
                "else tar the work dir)"
            )
        if config.snapshot_method == "containerd" and config.read_only:
            raise ConfigError(
                "snapshot_method='containerd' with read_only: the work dir is an emptyDir, not in the "
                "container's file system; use snapshot_method='auto' or 'tar'"
            )
        self.store = Path(config.snapshot_dir) if config.snapshot_dir else snaps.default_dir()
        self.mode = config.snapshot_method
        self.ctr = images.Ctr(images.address(config.containerd_address))
        self._probed: str | None = None  # containerd's version, once it answered
        self.why_not: str | None = None  # why containerd is not used (set after a probe)
        if self.mode == "tar":
            self.why_not = "snapshot_method='tar'"
        elif config.read_only:
            self.why_not = "read_only (the work dir is an emptyDir)"
        self.taken: set[str] = set()  # made here and not dropped: reap leaves them alone

    async def containerd(self) -> images.Ctr | None:
        """The containerd to import into, or None (``why_not`` says why); ConfigError when
        ``snapshot_method`` is "containerd" and it does not answer."""
        if self._probed is None and self.why_not is None:
            try:
                self._probed = await anyio.to_thread.run_sync(self.ctr.probe)
            except images.Unavailable as exc:
                self.why_not = str(exc)
        if self._probed is None and self.mode == "containerd":
            raise ConfigError(f"snapshot_method='containerd' but {self.why_not}")
        return self.ctr if self._probed is not None else None

    async def describe(self) -> str:
        ctr = await self._quiet()
        where = f"{self.ctr.socket} ({self._probed})" if ctr is not None else None
        return snaps.describe(self.store, where, self.why_not)

    async def _quiet(self) -> images.Ctr | None:
        try:
            return await self.containerd()
        except ConfigError:
            return None

    async def take(
        self, sandbox: Sandbox, pod: PodState, labels: dict[str, str], identity: dict[str, str], image: str
    ) -> str:
        """A snapshot of ``sandbox`` (its pod as the watch last saw it) by the best method."""
        ctr = await self.containerd()
        container_id = _container_id(pod)
        if ctr is not None and container_id:
            node = pod.node
            try:
                taken = await snaps.take_image(
                    ctr, container_id, node, self.store, labels, identity, image, sandbox.workdir
                )
            except images.Unavailable as exc:
                if self.mode == "containerd":
                    raise ConfigError(f"could not snapshot {sandbox.id} into containerd: {exc}") from None
                # this sandbox only (another node's, say): the tar below
            else:
                self.taken.add(taken)
                return taken
        elif self.mode == "containerd":
            raise ConfigError(f"could not snapshot {sandbox.id} into containerd: its pod names no container id")
        taken = await snaps.take(sandbox, self.store, labels, identity, image)
        self.taken.add(taken)
        return taken

    async def drop(self, snapshot_id: str) -> None:
        self.taken.discard(snapshot_id)
        ctr = await self._quiet()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(snaps.drop, self.store, snapshot_id, ctr)

    async def reap(self, older_than: float) -> list[str]:
        ctr = await self._quiet()
        return await anyio.to_thread.run_sync(snaps.reap, self.store, older_than, set(self.taken), ctr)


def _container_id(pod: PodState) -> str | None:
    """The sandbox container's containerd id (``containerd://<id>`` in the pod's status)."""
    runtime, _, container_id = (pod.container_id or "").partition("://")
    return container_id if runtime == "containerd" and container_id else None

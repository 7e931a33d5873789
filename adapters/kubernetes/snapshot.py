"""Snapshots and forks of kubernetes sandboxes (protocols.py, "Forks"), by one of two methods.

**containerd image** (the first choice; containerd_image.py): where the controller reaches the
containerd of the node the sandbox runs on (on the node, as root: a one-node cluster, or the
controller on the sandbox's node), ``snapshot`` imports the container's whole file system
(its image plus its writes: the work dir, and files a setup put anywhere else, e.g. ``/opt``
or installed packages) into that containerd as ``docker.io/orchard/ksnap:<id>``, and forks
run that image with pull policy ``Never`` on that node (``nodeName``). Not captured: running
processes, ``/tmp/.orchard`` (the shell protocol's) and the runtime's mount points
(``/etc/hosts`` ...). Not with ``read_only`` (the work dir is an emptyDir then).

**tar of the work dir** (the fallback; also ``snapshot_method="tar"``): the sandbox's work
dir (``spec.workdir``, default ``/workspace``), every file, dir and symlink in it with its mode
and mtime, as ``tar`` in the pod writes them. Not captured: the rest of the container's file
system, its processes, file owners (a fork's files belong to its own user, like a fresh
sandbox's), and anything tar cannot archive (sockets, FIFOs). The same scope as the local
adapter's snapshot. ``snapshot`` runs ``tar -cf - -C WORKDIR .`` in the sandbox through its
own ``open_stream`` (the exec websocket or the pod-IP relay) and writes the stream to a file
the controller keeps; ``create`` with ``spec.snapshot`` creates a pod as usual, then streams
the file into ``head -c SIZE | tar -xf -`` in it before it returns. The image needs ``tar``
and ``head`` (busybox and Debian images have both); without them ``snapshot`` is a
ConfigError (the rollout engine then sets each sample up on its own).

``snapshot_method="auto"`` (the default) uses containerd when ``ctr`` and the socket
(``containerd_address``, else ``CONTAINERD_ADDRESS``, else /run/containerd/containerd.sock)
answer and the sandbox's container is in that containerd, else the tar; ``"containerd"``
makes that a ConfigError instead. Pushing to a registry (multi-node clusters) is not built:
``snapshot_registry`` set is a ConfigError.

Where: ``<snapshot_dir>/ksnap-<id>/`` (``KubernetesConfig.snapshot_dir``, else
``ORCHARD_K8S_SNAPSHOT_DIR``, else ``$XDG_CACHE_HOME/orchard-async/kubernetes-snapshots``),
holding ``lease.json`` (the run's lease labels, the controller's identity, the method and the
image's name, written first), and ``tree.tar`` for the tar method. ``reap`` removes a
snapshot whose controller is dead (on this host) or whose lease expired, as it does a pod: its
dir and its image; and images ``docker.io/orchard/ksnap:*`` whose labels (the same lease) say
so, wherever their dir is.
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

from orchard_async.adapters.kubernetes import containerd_image as images
from orchard_async.errors import ConfigError, CreateFailed, SandboxLost
from orchard_async.kit import labels as names
from orchard_async.kit.container_shell import CTL_DIR, is_abandoned
from orchard_async.protocols import Sandbox

PREFIX = "ksnap-"
SNAPSHOT_TTL = 24 * 3600.0  # like the local adapter's: a group's samples start from it later
CHUNK = 256 * 1024
HALF_MADE_AGE = 60.0  # seconds: a dir without a lease that reap leaves alone (being written)
# `$1` the work dir, `$2` where tar's stderr and exit code go (read after the stream ends:
# the stream itself is the archive, nothing else may be written to it).
TAKE = 'tar -cf - -C "$1" . 2>"$2"; echo "@@exit $?" >>"$2"'
# `$1` the archive's size, `$2` the work dir. The exec protocol cannot close stdin alone:
# head stops at the archive's end instead.
RESTORE = 'head -c "$1" | tar -xof - -C "$2" 2>&1; echo "@@exit $?"'
TAR_METHOD = "tar of the work dir, kept by the controller"
IMAGE_METHOD = "containerd image import"


def default_dir() -> Path:
    configured = os.environ.get("ORCHARD_K8S_SNAPSHOT_DIR")
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "orchard-async" / "kubernetes-snapshots"


def describe(store: Path, containerd: str | None, why_not: str | None = None) -> str:
    """What ``doctor`` says of forks: ``containerd`` the socket in use, or ``why_not``."""
    if containerd:
        return (
            f"forks: {IMAGE_METHOD} into {containerd} (the whole file system; forks pinned to its node), "
            f"else a {TAR_METHOD} in {store}"
        )
    return f"forks: {TAR_METHOD} in {store} (the work dir only; no containerd image import: {why_not})"


def _checked(store: Path, snapshot_id: str) -> Path:
    if not snapshot_id.startswith(PREFIX) or "/" in snapshot_id or snapshot_id in (".", ".."):
        raise ConfigError(f"{snapshot_id!r} is not a kubernetes snapshot id (from KubernetesAdapter.snapshot)")
    return store / snapshot_id


def source(store: Path, snapshot_id: str) -> tuple[Path | None, dict[str, Any]]:
    """The snapshot's archive (None for an image: ``lease["fork_image"]``) and lease, or
    ConfigError for one that is not there."""
    base = _checked(store, snapshot_id)
    try:
        lease = json.loads((base / "lease.json").read_text())
    except (OSError, ValueError):
        lease = None
    if lease is not None and lease.get("method") == "containerd":
        return None, lease
    if lease is None or not (base / "tree.tar").is_file():
        raise ConfigError(
            f"snapshot {snapshot_id} does not exist under {store} (dropped, or reaped after its run died)"
        )
    return base / "tree.tar", lease


def _lease(labels: dict[str, str], identity: dict[str, str], image: str, workdir: str) -> dict[str, Any]:
    snapshot_id = f"{PREFIX}{uuid.uuid4().hex[:16]}"
    expires_at = time.time() + SNAPSHOT_TTL
    return {
        "id": snapshot_id,
        "labels": {**labels, names.EXPIRES: str(int(expires_at))},
        "identity": identity,
        "image": image,
        "workdir": workdir,
        "method": "tar",
    }


async def _make_dir(store: Path, lease: dict[str, Any]) -> Path:
    base = store / lease["id"]

    def make_dir() -> None:
        store.mkdir(parents=True, exist_ok=True, mode=0o700)
        base.mkdir(mode=0o700)
        # The lease first: a controller killed from here on leaves a dir reap knows as its own.
        (base / "lease.json").write_text(json.dumps(lease))

    try:
        await anyio.to_thread.run_sync(make_dir)
    except OSError as exc:
        raise ConfigError(
            f"cannot keep kubernetes snapshots in {store} ({exc.strerror or exc}); "
            "set the adapter's snapshot_dir (or ORCHARD_K8S_SNAPSHOT_DIR) to a writable dir"
        ) from None
    return base


def image_labels(lease: dict[str, Any]) -> dict[str, str]:
    """The containerd image's labels: the lease's, and the controller's identity field by field
    (``ctr images ls`` prints labels comma-joined: no JSON there)."""
    kept = {key: lease["labels"][key] for key in (names.OWNER, names.RUN, names.EXPIRES) if key in lease["labels"]}
    identity = {f"{names.CONTROLLER}.{key}": value for key, value in lease["identity"].items()}
    return {**kept, **identity, "orchard.snapshot": lease["id"]}


def _identity_of(labels: dict[str, str]) -> str:
    prefix = f"{names.CONTROLLER}."
    return json.dumps({key[len(prefix) :]: value for key, value in labels.items() if key.startswith(prefix)})


async def take_image(
    ctr: images.Ctr,
    container_id: str,
    node: str | None,
    store: Path,
    labels: dict[str, str],
    identity: dict[str, str],
    image: str,
    workdir: str,
) -> str:
    """Import the container's file system into the node's containerd as a new snapshot's
    image; its id. images.Unavailable (nothing left behind) when containerd cannot."""
    lease = _lease(labels, identity, image, workdir)
    lease.update(method="containerd", fork_image=images.image_ref(lease["id"]), node=node)
    base = await _make_dir(store, lease)
    try:
        built = await anyio.to_thread.run_sync(
            images.build, ctr, container_id, lease["fork_image"], image_labels(lease), base
        )
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_remove, store, lease["id"], ctr)
        raise
    lease["built"] = built
    await anyio.to_thread.run_sync((base / "lease.json").write_text, json.dumps(lease))
    return lease["id"]


async def take(sandbox: Sandbox, store: Path, labels: dict[str, str], identity: dict[str, str], image: str) -> str:
    """Archive ``sandbox``'s work dir into a new snapshot under ``store``; its id."""
    lease = _lease(labels, identity, image, sandbox.workdir)
    base = await _make_dir(store, lease)
    try:
        await _archive(sandbox, base / "tree.tar")
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(shutil.rmtree, base, True)
        raise
    return lease["id"]


async def _archive(sandbox: Sandbox, target: Path) -> None:
    status = posixpath.join(CTL_DIR, f"snapshot.{uuid.uuid4().hex[:8]}")
    try:
        stream = await sandbox.open_stream(["sh", "-c", TAKE, "orchard-snapshot", sandbox.workdir, status])
    except FileNotFoundError as exc:
        raise ConfigError(f"sandbox {sandbox.id}'s image has no sh: kubernetes snapshots need sh and tar") from exc
    async with stream, await anyio.open_file(target, "wb") as out:
        while True:
            try:
                chunk = await stream.receive(CHUNK)
            except anyio.EndOfStream:
                break
            except anyio.BrokenResourceError as exc:
                raise SandboxLost(f"could not snapshot {sandbox.id}: the tar stream broke ({exc})") from exc
            await out.write(chunk)
    said = await sandbox.exec(f"cat {shlex.quote(status)} 2>/dev/null; rm -f {shlex.quote(status)}", timeout=30)
    text = said.stdout.decode(errors="replace").strip()
    if text.endswith("@@exit 0"):
        return
    why = text.rpartition("@@exit")[0].strip()[-300:] or text[-300:] or "no exit status"
    if "not found" in why:
        raise ConfigError(f"sandbox {sandbox.id}'s image has no tar: kubernetes snapshots need tar in the image")
    raise SandboxLost(f"could not snapshot {sandbox.id}: tar in the pod failed: {why}")


async def restore(sandbox: Sandbox, archive: Path) -> None:
    """Extract a snapshot's archive into ``sandbox``'s (fresh) work dir; CreateFailed if not."""
    size = (await anyio.Path(archive).stat()).st_size
    command = ["sh", "-c", RESTORE, "orchard-fork", str(size), sandbox.workdir]
    try:
        stream = await sandbox.open_stream(command)
    except FileNotFoundError as exc:
        raise CreateFailed(f"could not fork into {sandbox.id}: its image has no sh") from exc
    said = bytearray()
    async with stream:
        async with anyio.create_task_group() as group:

            async def read_all() -> None:  # concurrently: tar's complaints must not fill the pipe
                try:
                    while True:
                        said.extend(await stream.receive())
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return

            group.start_soon(read_all)
            async with await anyio.open_file(archive, "rb") as source_file:
                try:
                    while chunk := await source_file.read(CHUNK):
                        await stream.send(chunk)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass  # tar ended early: what it said is read below
    text = said.decode(errors="replace").strip()
    if not text.endswith("@@exit 0"):
        why = text.rpartition("@@exit")[0].strip()[-300:] or text[-300:] or "the stream ended early"
        raise CreateFailed(f"could not fork into {sandbox.id}: tar in the pod failed: {why}")


def _remove(store: Path, snapshot_id: str, ctr: images.Ctr | None) -> bool:
    """Remove a snapshot's image (when it has one) and dir; False (the dir kept, for a later
    reap) when its image could not be removed."""
    base = store / snapshot_id
    try:
        fork_image = json.loads((base / "lease.json").read_text()).get("fork_image")
    except (OSError, ValueError, AttributeError):
        fork_image = None
    if fork_image:
        if ctr is None:
            return False
        try:
            ctr.remove(fork_image)
        except images.Unavailable:
            return False
    shutil.rmtree(base, ignore_errors=True)
    return True


def drop(store: Path, snapshot_id: str, ctr: images.Ctr | None = None) -> None:
    """Remove a snapshot; nothing when it is gone already. Blocking."""
    if snapshot_id.startswith(PREFIX) and "/" not in snapshot_id:
        _remove(store, snapshot_id, ctr)


def reap(store: Path, older_than: float, keep: set[str], ctr: images.Ctr | None = None) -> list[str]:
    """Remove snapshots (not in ``keep``) whose controller is dead or whose lease expired
    ``older_than`` seconds ago, and lease-less dirs older than a minute; with ``ctr``, also
    snapshot images in containerd whose labels say the same. Blocking."""
    now = time.time()
    removed: set[str] = set()
    for base in store.iterdir() if store.is_dir() else []:
        if not base.name.startswith(PREFIX) or base.name in keep:
            continue
        try:
            lease = json.loads((base / "lease.json").read_text())
            alive = names.annotated_controller_alive(json.dumps(lease["identity"]))
            doomed = is_abandoned(lease["labels"], ended=False, controller_alive=alive, now=now, older_than=older_than)
        except (OSError, ValueError, KeyError, TypeError):
            try:
                doomed = now - base.stat().st_mtime > HALF_MADE_AGE
            except OSError:
                continue
        if doomed and _remove(store, base.name, ctr):
            removed.add(base.name)
    if ctr is not None:
        for ref, labels in ctr.images().items():
            snapshot_id = ref.rpartition(":")[2]
            if snapshot_id in keep or names.EXPIRES not in labels:
                continue  # unlabelled: imported a moment ago, or its dir (above) says whose it is
            alive = names.annotated_controller_alive(_identity_of(labels))
            if is_abandoned(labels, ended=False, controller_alive=alive, now=now, older_than=older_than):
                try:
                    ctr.remove(ref)
                except images.Unavailable:
                    continue
                shutil.rmtree(store / snapshot_id, ignore_errors=True)
                removed.add(snapshot_id)
    return sorted(removed)

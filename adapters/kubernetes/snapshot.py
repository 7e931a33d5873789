"""Snapshots and forks of kubernetes sandboxes: the work dir as a tar stream, kept by the
controller (protocols.py, "Forks").

What is captured: the sandbox's work dir (``spec.workdir``, default ``/workspace``), every
file, dir and symlink in it with its mode and mtime, as ``tar`` in the pod writes them. Not
captured: the rest of the container's file system (packages a setup installed elsewhere,
``/tmp``), its processes, file owners (a fork's files belong to its own user, like a fresh
sandbox's), and anything tar cannot archive (sockets, FIFOs). The same scope as the local
adapter's snapshot.

How: ``snapshot`` runs ``tar -cf - -C WORKDIR .`` in the sandbox through its own
``open_stream`` (the exec websocket or the pod-IP relay) and writes the stream to a file the
controller keeps; ``create`` with ``spec.snapshot`` creates a pod as usual, then streams the
file into ``head -c SIZE | tar -xf -`` in it before it returns. The image needs ``tar`` and
``head`` (busybox and Debian images have both); without them ``snapshot`` is a ConfigError
(the rollout engine then sets each sample up on its own).

Not the issue's first choice: an image of the pod's whole file system imported into the
node's containerd (one-node cluster) or pushed to a registry. What that would take, as
checked on scripts/ci-kubernetes.sh's cluster (containerd 1.6, overlayfs snapshotter, the
controller on the node as root): ``ctr -n k8s.io snapshots mounts`` of the container id (pod
status) names the running container's upper dir, which holds the writes (the work dir, and
also ``/tmp/.orchard`` and ``/etc/hosts``, to leave out); that dir as a layer tar (overlay
whiteouts turned into ``.wh.`` files), a manifest and config of the base image's layers plus
it, ``ctr images import``, image labels for ``reap``, and forks run with pull ``Never``.
Not built yet.

Where: ``<snapshot_dir>/ksnap-<id>/`` (``KubernetesConfig.snapshot_dir``, else
``ORCHARD_K8S_SNAPSHOT_DIR``, else ``$XDG_CACHE_HOME/orchard-async/kubernetes-snapshots``),
holding ``lease.json`` (the run's lease labels and the controller's identity, written
first) and ``tree.tar``. ``reap`` removes a snapshot whose controller is dead (on this host)
or whose lease expired, as it does a pod.
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

from orchard_async import labels as names
from orchard_async.container_shell import CTL_DIR, is_abandoned
from orchard_async.errors import ConfigError, CreateFailed, SandboxLost
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
METHOD = "tar of the work dir, kept by the controller"


def default_dir() -> Path:
    configured = os.environ.get("ORCHARD_K8S_SNAPSHOT_DIR")
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "orchard-async" / "kubernetes-snapshots"


def describe(store: Path) -> str:
    return f"forks: {METHOD} in {store} (the work dir only; no containerd import or registry push yet)"


def _checked(store: Path, snapshot_id: str) -> Path:
    if not snapshot_id.startswith(PREFIX) or "/" in snapshot_id or snapshot_id in (".", ".."):
        raise ConfigError(f"{snapshot_id!r} is not a kubernetes snapshot id (from KubernetesAdapter.snapshot)")
    return store / snapshot_id


def source(store: Path, snapshot_id: str) -> tuple[Path, dict[str, Any]]:
    """The snapshot's archive and lease, or ConfigError for one that is not there."""
    base = _checked(store, snapshot_id)
    try:
        lease = json.loads((base / "lease.json").read_text())
    except (OSError, ValueError):
        lease = None
    if lease is None or not (base / "tree.tar").is_file():
        raise ConfigError(
            f"snapshot {snapshot_id} does not exist under {store} (dropped, or reaped after its run died)"
        )
    return base / "tree.tar", lease


async def take(sandbox: Sandbox, store: Path, labels: dict[str, str], identity: dict[str, str], image: str) -> str:
    """Archive ``sandbox``'s work dir into a new snapshot under ``store``; its id."""
    snapshot_id = f"{PREFIX}{uuid.uuid4().hex[:16]}"
    base = store / snapshot_id
    expires_at = time.time() + SNAPSHOT_TTL
    lease = {
        "id": snapshot_id,
        "labels": {**labels, names.EXPIRES: str(int(expires_at))},
        "identity": identity,
        "image": image,
        "workdir": sandbox.workdir,
    }

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
    try:
        await _archive(sandbox, base / "tree.tar")
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(shutil.rmtree, base, True)
        raise
    return snapshot_id


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


def drop(store: Path, snapshot_id: str) -> None:
    """Remove a snapshot; nothing when it is gone already."""
    if snapshot_id.startswith(PREFIX) and "/" not in snapshot_id:
        shutil.rmtree(store / snapshot_id, ignore_errors=True)


def reap(store: Path, older_than: float, keep: set[str]) -> list[str]:
    """Remove snapshots (not in ``keep``) whose controller is dead or whose lease expired
    ``older_than`` seconds ago, and lease-less dirs older than a minute. Blocking."""
    if not store.is_dir():
        return []
    now = time.time()
    removed: list[str] = []
    for base in store.iterdir():
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
        if doomed:
            shutil.rmtree(base, ignore_errors=True)
            removed.append(base.name)
    return sorted(removed)

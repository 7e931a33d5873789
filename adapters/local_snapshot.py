"""Snapshots and forks of local sandboxes: a frozen copy of a work dir, and new work dirs
started from it as copy-on-write clones.

A snapshot is ``<root>/snap-<id>/``: ``lease.json`` (the run's lease labels, so ``reap``
removes it once its controller is dead, like a sandbox) and ``tree/``, a copy of the work
dir taken when it was made. The adapter root is hidden from every sandbox, so a snapshot is
out of reach of the forks that start from it.

How a fork's work dir is made from ``tree/``, picked once per adapter root (``fork_method``):

* ``reflink``: ``cp --reflink=always`` (FICLONE): a clone that shares blocks until written,
  on file systems that have it (btrfs, xfs with reflink, bcachefs);
* ``overlay``: overlayfs with ``tree/`` as its read-only lower layer and the sandbox's own
  ``upper/`` on top, mounted on the host over the fork's ``work/`` before the sandbox starts
  (root only: a mount in the host's namespace needs CAP_SYS_ADMIN there). The launcher, the
  adapter's teardown and ``reap`` unmount it before removing the sandbox's dir;
* ``copy``: ``cp -a``, where neither works.

The probe for overlay runs a real sandbox on a mounted overlay and has it write, delete and
rename what it inherited, as the sandbox's user: a mount that works on the host but not
through the sandbox's namespaces is not used.

Ownership: files keep their owner (the sandbox's user wrote them); the fork's top dir (its
``work/``, or ``upper/`` whose attributes an overlay's root takes) is given to the
sandbox's user like a fresh sandbox's ``work/``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import functools
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from orchard_async.adapters import local_isolation as iso
from orchard_async.errors import ConfigError, CreateFailed

PREFIX = "snap-"  # snapshot dirs under the adapter root; sandbox dirs are "lo-"
PROBE_PREFIX = ".fork-probe-"  # fork_method's scratch dir under the root (reap removes a stale one)
METHODS = ("reflink", "overlay", "copy")
FICLONE = 0x40049409  # ioctl: clone a whole file (linux/fs.h)
MNT_DETACH = 2

# What a sandbox does to a forked work dir in the probe: change, delete and rename what it
# inherited (a directory rename needs overlay's redirect_dir, or a copy-up fallback) and add.
PROBE_SCRIPT = (
    "echo changed >kept && rm gone && mv dir moved && test -f moved/inner && echo new >added && ls >/dev/null"
)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount_overlay(lower: Path, upper: Path, workdir: Path, target: Path) -> None:
    options = f"lowerdir={lower},upperdir={upper},workdir={workdir}".encode()
    if _libc().mount(b"overlay", str(target).encode(), b"overlay", 0, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount overlay on {target}: {os.strerror(err)}")


def unmount(path: Path) -> None:
    """Detach a mount at ``path`` if there is one (lazily: a process still in it keeps it)."""
    if os.path.ismount(path):
        _libc().umount2(str(path).encode(), MNT_DETACH)


def remove_sandbox_dir(base: Path) -> None:
    """Remove a sandbox's dir, its fork's overlay unmounted first (removing through the
    mount would fill ``upper/`` with whiteouts and leave ``work/`` busy)."""
    if (base / "upper").is_dir():
        unmount(base / "work")
    elif base.name.startswith(PROBE_PREFIX):  # a probe cut short while its overlay was mounted
        unmount(base / "box" / "work")
    shutil.rmtree(base, ignore_errors=True)


def _reflink_works(scratch: Path) -> str:
    source, clone = scratch / "reflink-source", scratch / "reflink-clone"
    source.write_bytes(b"x" * 4096)
    with open(source, "rb") as src, open(clone, "wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
        except OSError as exc:
            return f"no reflink on this file system ({os.strerror(exc.errno or errno.EOPNOTSUPP)})"
    return ""


def _overlay_works(scratch: Path, mode: str, user_namespace: bool) -> str:
    """Mount an overlay as a fork would and run the probe script in a sandbox built on it."""
    if not iso.is_root():
        return "overlay needs root (a mount in the host's namespace)"
    if mode == "none":
        return "sandboxes without namespaces are not probed for overlay"
    lower, base = scratch / "lower", scratch / "box"
    (lower / "dir").mkdir(parents=True)
    for name in ("kept", "gone", "dir/inner"):
        (lower / name).write_text("base\n")
    for path in (base / "work", base / "ctl", base / "upper", base / "ovwork"):
        path.mkdir(parents=True)
    uid, gid = iso.sandbox_ids()
    for path in (lower, lower / "dir", *(lower / n for n in ("kept", "gone", "dir/inner")), base, base / "upper"):
        os.chown(path, uid, gid)
    for path in (base / "work", base / "ctl"):
        os.chown(path, uid, gid)
    try:
        _mount_overlay(lower, base / "upper", base / "ovwork", base / "work")
    except OSError as exc:
        return str(exc)
    try:
        argv = iso.sandbox_argv(mode, iso.layout(scratch, base, network=False), user_namespace)
        done = subprocess.run(
            [*argv, "sh", "-c", PROBE_SCRIPT],
            capture_output=True,
            timeout=20,
            env={"PATH": iso.SYSTEM_PATH},
            cwd=base / "work",
        )
        if done.returncode != 0:
            return f"a sandbox could not use an overlay work dir: {done.stderr.decode(errors='replace').strip()[-200:]}"
        if (lower / "kept").read_text() != "base\n" or not (lower / "gone").exists():
            return "a sandbox's writes reached the overlay's lower layer"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    finally:
        unmount(base / "work")
    return ""


@functools.cache
def fork_method(root: str, mode: str, user_namespace: bool) -> tuple[str, str]:
    """(method, why the better ones are not used) for forks under ``root`` in isolation
    ``mode``: probed once per root and mode, on the root's own file system."""
    os.makedirs(root, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=PROBE_PREFIX, dir=root))
    try:
        no_reflink = _reflink_works(scratch)
        if not no_reflink:
            return "reflink", ""
        no_overlay = _overlay_works(scratch, mode, user_namespace)
        if not no_overlay:
            return "overlay", no_reflink
        return "copy", f"{no_reflink}; {no_overlay}"
    finally:
        unmount(scratch / "box" / "work")
        shutil.rmtree(scratch, ignore_errors=True)


def describe(method: str, why: str) -> str:
    what = {
        "reflink": "copy-on-write clones (reflink) of the snapshot",
        "overlay": "overlayfs over the snapshot (copy-on-write per file)",
        "copy": "plain copies of the snapshot",
    }[method]
    return f"forks: {what}" + (f" ({why})" if why else "")


def _copy_tree(source: Path, target: Path, method: str) -> None:
    """``source``'s contents into the existing dir ``target``, owners and modes kept."""
    argv = ["cp", "-a", "--reflink=always" if method == "reflink" else "--reflink=never", f"{source}/.", f"{target}/"]
    done = subprocess.run(argv, capture_output=True)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv[:3])} failed: {done.stderr.decode(errors='replace').strip()[-300:]}")


def take(root: Path, work: Path, labels: dict[str, str], expires_at: float, method: str) -> str:
    """Copy ``work`` into a new snapshot under ``root``; its id. Blocking (run in a thread)."""
    snapshot_id = f"{PREFIX}{uuid.uuid4().hex[:16]}"
    base = root / snapshot_id
    base.mkdir(parents=True)
    # The lease first: a controller killed from here on leaves a dir reap knows as its own.
    lease = {"id": snapshot_id, "labels": labels, "expires_at": expires_at, "snapshot": True}
    (base / "lease.json").write_text(json.dumps(lease))
    tree = base / "tree"
    tree.mkdir(mode=0o755)
    try:
        _copy_tree(work, tree, "reflink" if method == "reflink" else "copy")
    except OSError:
        shutil.rmtree(base, ignore_errors=True)
        raise
    return snapshot_id


def tree_of(root: Path, snapshot_id: str) -> Path:
    """The snapshot's tree, or ConfigError for an id that is not a snapshot of this root."""
    if not snapshot_id.startswith(PREFIX) or "/" in snapshot_id or snapshot_id in (".", ".."):
        raise ConfigError(f"{snapshot_id!r} is not a local snapshot id (from LocalAdapter.snapshot)")
    tree = root / snapshot_id / "tree"
    if not tree.is_dir():
        raise ConfigError(f"snapshot {snapshot_id} does not exist under {root} (dropped, or reaped after its run died)")
    return tree


def fork_into(tree: Path, base: Path, method: str, owner: tuple[int, int] | None) -> None:
    """Make ``base/work`` (already made, empty) start as ``tree``. Blocking."""
    work = base / "work"
    try:
        if method == "overlay":
            upper, scratch = base / "upper", base / "ovwork"
            upper.mkdir(mode=0o755)
            scratch.mkdir(mode=0o700)
            if owner is not None:
                os.chown(upper, *owner)
            _mount_overlay(tree, upper, scratch, work)
        else:
            _copy_tree(tree, work, method)
            # cp -a gave work/ the snapshot tree's own owner and mode: a fresh sandbox's again.
            work.chmod(0o755)
            if owner is not None:
                os.chown(work, *owner)
    except OSError as exc:
        raise CreateFailed(f"could not fork the work dir from {tree.parent.name} ({method}): {exc}") from exc


def drop(root: Path, snapshot_id: str) -> None:
    """Remove a snapshot; nothing when it is gone already."""
    if snapshot_id.startswith(PREFIX) and "/" not in snapshot_id:
        shutil.rmtree(root / snapshot_id, ignore_errors=True)

"""Finding and removing what local sandboxes left: their processes (by the
``ORCHARD_SANDBOX`` variable every process of a sandbox inherits) and their dirs (by lease
file), snapshots included; see ``local`` for the lifetimes this cleans up after."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from orchard_async.adapters import local_snapshot as snaps
from orchard_async.kit import labels as names
from orchard_async.kit import procfs

SANDBOX_ENV = "ORCHARD_SANDBOX"  # the sandbox dir: names the sandbox and the root it lives in


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _sandbox_processes() -> dict[str, list[int]]:
    """Every process on the host that belongs to some local sandbox, by sandbox dir."""
    marker = SANDBOX_ENV.encode() + b"="
    found: dict[str, list[int]] = {}
    for pid, environ in procfs.environs():
        for var in environ.split(b"\0"):
            if var.startswith(marker):
                found.setdefault(var[len(marker) :].decode(), []).append(pid)
                break
    return found


def _kill_sandbox_processes(dirs: set[str], settle: float = 5.0) -> None:
    """Kill the processes of these sandboxes and wait (up to ``settle`` seconds) until they
    are gone: a kill is delivered at once, but a process takes a moment to die."""
    deadline = time.monotonic() + settle
    while True:
        left = [pid for sandbox_dir, pids in _sandbox_processes().items() if sandbox_dir in dirs for pid in pids]
        if not left or time.monotonic() > deadline:
            return
        for pid in left:
            _kill_quietly(pid)
        time.sleep(0.01)


def _lease_is_dead(lease: dict, now: float, older_than: float) -> bool:
    if lease.get("expires_at", 0) + older_than < now:
        return True
    return names.controller_alive(lease.get("labels", {}).get(names.CONTROLLER, "")) is not True


def reap_local(root: Path, older_than: float = 0.0, keep: set[str] | None = None) -> list[str]:
    """Remove sandboxes whose controller is dead or whose TTL has passed; return their ids.

    Also kills stray processes of sandboxes whose directory is already gone.
    """
    keep = keep or set()
    now = time.time()
    # Processes first: a sandbox's dir exists before its first process, so one created while
    # this runs is seen in the dir scan below and never mistaken for an orphan.
    processes = {
        Path(sandbox_dir).name: pids
        for sandbox_dir, pids in _sandbox_processes().items()
        if Path(sandbox_dir).parent == root  # other roots are other users' business
    }
    doomed: set[str] = set()
    live_dirs: set[str] = set()
    if root.exists():
        for base in root.iterdir():
            try:
                lease = json.loads((base / "lease.json").read_text())
            except (OSError, ValueError):
                # A dir without a readable lease is a half-created sandbox; leave young ones.
                if base.is_dir() and now - base.stat().st_mtime > 60 and base.name not in keep:
                    doomed.add(base.name)
                continue
            live_dirs.add(base.name)
            if base.name not in keep and _lease_is_dead(lease, now, older_than):
                doomed.add(base.name)
    orphans = {sid for sid in processes if sid not in live_dirs and sid not in keep}
    # Killed until none is left (a kill takes a moment, and a process not yet frozen may fork).
    _kill_sandbox_processes({str(root / sandbox_id) for sandbox_id in doomed | orphans if sandbox_id in processes})
    for sandbox_id in doomed | orphans:  # snapshots (snap-*) included: they carry leases too
        snaps.remove_sandbox_dir(root / sandbox_id)
    return sorted(doomed | orphans)

"""Finding and removing what local sandboxes left: their processes (by the
``ORCHARD_SANDBOX`` variable every process of a sandbox inherits) and their dirs (by lease
file), snapshots included; see ``local`` for the lifetimes this cleans up after.

Ending a closed sandbox's processes: where the sandbox has a PID namespace, a pidfd on the
namespace's init (``NamespaceInit``) ends them all and says when they are gone, without
looking at any other process; elsewhere (isolation ``none``, or no pidfd) a ``Sweeper``
scans every process's environment for the marker, one scan a round for every sandbox
being closed at the time."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

from orchard_async.adapters import local_snapshot as snaps
from orchard_async.kit import labels as names
from orchard_async.kit import procfs

SANDBOX_ENV = "ORCHARD_SANDBOX"  # the sandbox dir: names the sandbox and the root it lives in


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


MARKER = SANDBOX_ENV.encode() + b"="
SETTLE = 5.0  # seconds a closed sandbox's processes get to die before close stops waiting
KILL_PAUSE = 0.01  # a kill is delivered at once, but a process takes a moment to die


def _marker_value(environ: bytes) -> bytes | None:
    """The value of the first ``ORCHARD_SANDBOX=`` entry of an environment block. Searched
    for rather than split into entries: a scan reads every process's environment, and most
    carry no marker."""
    if environ.startswith(MARKER):
        start = len(MARKER)
    else:
        found = environ.find(b"\0" + MARKER)
        if found < 0:
            return None
        start = found + 1 + len(MARKER)
    end = environ.find(b"\0", start)
    return environ[start:] if end < 0 else environ[start:end]


def _sandbox_processes() -> dict[str, list[int]]:
    """Every process on the host that belongs to some local sandbox, by sandbox dir."""
    found: dict[str, list[int]] = {}
    for pid, environ in procfs.environs():
        value = _marker_value(environ)
        if value is not None:
            found.setdefault(value.decode(), []).append(pid)
    return found


def _kill_found(dirs: set[str] | frozenset[str]) -> set[str]:
    """One scan: kill every process of these sandboxes; return the sandboxes that had any."""
    busy = set()
    for sandbox_dir, pids in _sandbox_processes().items():
        if sandbox_dir in dirs:
            busy.add(sandbox_dir)
            for pid in pids:
                _kill_quietly(pid)
    return busy


def _kill_sandbox_processes(dirs: set[str], settle: float = SETTLE) -> None:
    """Kill the processes of these sandboxes and wait (up to ``settle`` seconds) until they
    are gone."""
    deadline = time.monotonic() + settle
    while dirs and _kill_found(dirs) and time.monotonic() <= deadline:
        time.sleep(KILL_PAUSE)


@dataclass(eq=False)
class _Sweep:
    dirs: frozenset[str]
    deadline: float
    done: bool = False


class Sweeper:
    """Kills the processes of sandboxes being closed until none is left, for any number of
    closes at once with one scan of ``/proc`` a round: a scan reads every process's
    environment, so a scan per close made a storm of closes quadratic (256 aborted episodes
    made 256 scans of some 2,000 processes each, a round). A close waits for a round that
    began after it asked, and is done at the first such round that finds none of its
    processes (or when ``settle`` seconds have passed, as ``_kill_sandbox_processes``).

    Whoever waits leads the next round when none is under way, so no task of its own is
    needed and a close never waits for another's processes. One event loop's (an adapter's)."""

    def __init__(self, settle: float = SETTLE):
        self.settle = settle
        self.scans = 0  # rounds run: what the batching saves is visible to tests
        self._waiting: list[_Sweep] = []
        self._round_over: anyio.Event | None = None  # while a round is under way
        self._killed_at = 0.0

    async def sweep(self, dirs: set[str]) -> None:
        request = _Sweep(frozenset(dirs), time.monotonic() + self.settle)
        self._waiting.append(request)
        try:
            while not request.done:
                if self._round_over is None:
                    self._round_over = over = anyio.Event()
                    try:
                        await self._round()
                    finally:
                        self._round_over = None
                        over.set()
                else:
                    await self._round_over.wait()
        finally:
            if not request.done:
                self._waiting.remove(request)

    async def _round(self) -> None:
        pause = self._killed_at + KILL_PAUSE - time.monotonic()
        if pause > 0:
            await anyio.sleep(pause)
        # Only those already waiting can be judged by this scan: a process listed after it
        # began could be one of a later request's.
        covered = list(self._waiting)
        busy = await anyio.to_thread.run_sync(_kill_found, frozenset().union(*(r.dirs for r in covered)))
        self.scans += 1
        now = time.monotonic()
        if busy:
            self._killed_at = now
        for request in covered:
            if not (request.dirs & busy) or now > request.deadline:
                request.done = True
                self._waiting.remove(request)


class NamespaceInit:
    """A pidfd on the init of a sandbox's PID namespace, opened as the sandbox closes.
    Killing it ends every process of the namespace, and the kernel lets the init finish
    exiting only once every other process of the namespace has been reaped (the kernel's
    ``zap_pid_ns_processes``, which runs before the init counts as exited); a pidfd polls
    readable once its process has exited. So a readable pidfd means none of the
    sandbox's processes is left, without a scan, and the pidfd cannot name a reused pid.
    An init already gone when the sandbox closes is not found: the caller sweeps instead."""

    def __init__(self, fd: int):
        self.fd = fd

    @classmethod
    def of(cls, launcher: int) -> NamespaceInit | None:
        """The init among the launcher's descendants (the first process whose innermost pid
        is 1 in a namespace below this one: a namespace a sandbox's command makes is further
        down), or None where there is none or no pidfd."""
        if not hasattr(os, "pidfd_open"):
            return None
        queue = [(launcher, 0)]
        while queue:
            pid, parent = queue.pop()
            try:
                ns_pids = procfs.ns_pids(pid)
            except ValueError:
                continue
            if len(ns_pids) > 1 and ns_pids[-1] == 1:
                try:
                    fd = os.pidfd_open(pid)
                except OSError:
                    return None
                if procfs.parent(pid) != parent:  # gone, and its pid reused, before the pidfd held it
                    os.close(fd)
                    return None
                return cls(fd)
            queue += [(child, pid) for child in procfs.children(pid)]
        return None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # gone; or left to EOF and the sweep
            signal.pidfd_send_signal(self.fd, signal.SIGKILL)

    def gone(self) -> bool:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        return bool(poller.poll(0))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


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

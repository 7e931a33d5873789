"""One reader of ``/proc`` for the controller's facts about processes: start times (the
controller identity), environments (which processes belong to a local sandbox), parents and
children, CPU and memory, its own cgroup and PID namespace.

Not psutil: the identity needs the kernel's start time in clock ticks as ``/proc`` prints it
(psutil gives seconds since the epoch, so old and new labels would disagree), and the local
adapter needs ``NSpid``, ``task/<pid>/children``, ``/proc/self/cgroup`` and the PID namespace
link, none of which psutil reads; ``comm`` is wanted as the kernel truncates it.

Pids are those of the PID namespace of the process reading (the controller's). A local
sandbox with a PID namespace of its own shows here under host pids; what the sandbox calls a
process is the last field of its ``NSpid`` (``ns_pids``). Code that runs inside a sandbox
reads the sandbox's own ``/proc`` and keeps its own readers: it cannot import this package.

Every reader answers None (or nothing) for a process that is gone or not ours to read:
processes come and go between a listing and a read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
Pid = int | str  # a number, or "self"


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def pids() -> list[int]:
    """Every process visible in this PID namespace."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def stat(pid: Pid = "self") -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces and
    parentheses): [0] the state, [1] the parent, [11:15] utime, stime, cutime and cstime in
    ticks, [19] the start time in ticks since boot."""
    raw = _read(f"/proc/{pid}/stat")
    return None if raw is None else raw.rsplit(b")", 1)[1].decode().split()


def start_ticks(pid: Pid = "self") -> str | None:
    """The kernel's start time of a process (clock ticks since boot): with the pid, a name
    for one process that a reused pid cannot take."""
    fields = stat(pid)
    return None if fields is None else fields[19]


def parent(pid: Pid) -> int | None:
    fields = stat(pid)
    return None if fields is None else int(fields[1])


def cpu_seconds(pid: Pid = "self") -> tuple[float, float] | None:
    """(own, reaped children's) user + system CPU seconds of a process."""
    fields = stat(pid)
    if fields is None:
        return None
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / TICKS_PER_SECOND, (cutime + cstime) / TICKS_PER_SECOND


def comm(pid: Pid) -> str | None:
    """The command name as the kernel keeps it (at most 15 characters)."""
    raw = _read(f"/proc/{pid}/comm")
    return None if raw is None else raw.decode(errors="replace").strip()


def cmdline(pid: Pid) -> list[bytes] | None:
    raw = _read(f"/proc/{pid}/cmdline")
    return None if raw is None else raw.split(b"\0")


def environs() -> Iterator[tuple[int, bytes]]:
    """(pid, its environment block: ``NAME=value`` entries each ended by a NUL) of every
    process whose environment this process may read."""
    for pid in pids():
        raw = _read(f"/proc/{pid}/environ")
        if raw is not None:
            yield pid, raw


def status(pid: Pid = "self") -> dict[str, str] | None:
    """``/proc/<pid>/status`` by field name (values stripped, units kept: ``VmHWM`` is
    ``"1234 kB"``)."""
    raw = _read(f"/proc/{pid}/status")
    if raw is None:
        return None
    fields = {}
    for line in raw.decode(errors="replace").splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return fields


def status_kib(field: str, pid: Pid = "self") -> int | None:
    """A size field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``, ...) in KiB."""
    value = (status(pid) or {}).get(field)
    return int(value.split()[0]) if value else None


def ns_pids(pid: Pid) -> list[int]:
    """A process's pid in each PID namespace it is in, this one's first, its innermost last.
    Only its line of ``status`` is parsed: a local sandbox's close asks this of a few
    processes, in the event loop, and an abort storm closes hundreds at once."""
    raw = _read(f"/proc/{pid}/status")
    start = -1 if raw is None else raw.find(b"\nNSpid:")
    if raw is None or start < 0:
        return []
    end = raw.find(b"\n", start + 1)
    return [int(x) for x in raw[start + len(b"\nNSpid:") : end if end >= 0 else None].split()]


def children(pid: Pid) -> list[int]:
    """The children of a process's main thread."""
    raw = _read(f"/proc/{pid}/task/{pid}/children")
    return [] if raw is None else [int(child) for child in raw.split()]


def pid_namespace() -> str:
    """This process's PID namespace (``pid:[inode]``), "" when it cannot be read."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def own_cgroups() -> list[str] | None:
    """The lines of ``/proc/self/cgroup``: ``id:controllers:path``, v2's as ``0::path``."""
    raw = _read("/proc/self/cgroup")
    return None if raw is None else raw.decode().splitlines()


def memory_total_kib() -> int | None:
    """The machine's memory (``MemTotal`` of ``/proc/meminfo``) in KiB."""
    for line in (_read("/proc/meminfo") or b"").decode().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return None


def machine_busy_seconds() -> float:
    """CPU seconds every core spent not idle (nor waiting on I/O) since boot (``/proc/stat``)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / TICKS_PER_SECOND

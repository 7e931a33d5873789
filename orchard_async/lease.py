"""Who owns a sandbox: the controller's identity, written into every sandbox's labels so
that ``reap`` can tell a live run's sandboxes from a dead one's.

The identity is ``<host>:<pid>:<kernel start time>``; the start time makes it name one
process, not a PID the kernel may have reused since.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

CONTROLLER_LABEL = "orchard.controller"


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of a process (clock ticks since boot), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def controller_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{process_start_time(os.getpid())}"


def controller_alive(label: str) -> bool | None:
    """Is the process a controller label names alive? None when this host cannot tell (the
    label names another host, or is malformed): then only the sandbox's expiry decides."""
    host, _, rest = label.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    return process_start_time(int(pid)) == start

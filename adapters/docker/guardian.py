"""The guardian: what removes a dead controller's containers that never started.

A controller killed between docker's create and start leaves a container in state "created":
no process runs in it, so nothing inside can end it, and its TTL never comes (the timer is
its main process). Every other container of a dead controller ends itself (the controller
watch and the shell's wrapper, container.py and container_shell); this one needs someone
outside. The adapter starts this script once, on its first create, as a process of its own
session (a Ctrl-C or a kill of the controller's process group does not reach it), with a
pipe from the controller as stdin:

* the adapter's ``close`` writes a byte and closes the pipe: the guardian exits, doing nothing;
* the pipe closes with nothing written (the controller died, even by SIGKILL): for LINGER
  seconds it removes the controller's containers that are "created" (never started) or
  "exited"/"dead" (ended and not removed), every POLL seconds: a create the daemon was still
  making when the controller died shows up within a daemon call's timeout.

It speaks to the daemon's unix socket with the standard library only, and is run with
``python -I -S``: it starts in milliseconds and imports nothing of the controller's.
``python -I -S guardian.py SOCKET CONTROLLER RUN`` (the labels ``orchard.controller`` and
``orchard.run`` of the containers it watches).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse

LINGER = 30.0  # the docker adapter's API_TIMEOUT: the longest a create it sent may still be under way
POLL = 0.5
CALL_TIMEOUT = 10.0
ORPHAN_STATES = ("created", "exited", "dead")  # no process of its own will ever end or remove it


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost", timeout=CALL_TIMEOUT)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


def call(path: str, method: str, url: str) -> tuple[int, bytes]:
    connection = UnixConnection(path)
    try:
        connection.request(method, url)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def orphans(path: str, controller: str, run: str) -> list[str]:
    filters = json.dumps({"label": [f"orchard.controller={controller}", f"orchard.run={run}"]})
    status, body = call(path, "GET", "/containers/json?all=1&filters=" + urllib.parse.quote(filters))
    if status != 200:
        return []
    return [entry["Id"] for entry in json.loads(body) if entry.get("State") in ORPHAN_STATES]


def guard(path: str, controller: str, run: str) -> None:
    if sys.stdin.buffer.read():  # the adapter closed: it removed its containers itself
        return
    deadline = time.monotonic() + LINGER
    while time.monotonic() < deadline:
        try:
            for container in orphans(path, controller, run):
                call(path, "DELETE", f"/containers/{container}?force=1")  # 404, 409: already going
        except (OSError, http.client.HTTPException, ValueError):
            pass  # the daemon is restarting or busy: the next poll tries again
        time.sleep(POLL)


def start(endpoint: str, controller: str, run: str) -> subprocess.Popen[bytes] | None:
    """Start the guardian of one adapter's containers on the daemon at ``endpoint``; None when
    that is no unix socket (a daemon elsewhere: its never-started containers wait for ``reap``)."""
    if not endpoint.startswith("unix://"):
        return None
    argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), endpoint.removeprefix("unix://"), controller, run]
    try:
        return subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
    except OSError:
        return None


if __name__ == "__main__":
    guard(*sys.argv[1:4])

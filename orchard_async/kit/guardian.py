"""The end of an adapter's guardian: a process of its own (docker's removes never-started
containers, kubernetes' deletes pods) that acts only when its stdin closes with nothing
written, i.e. when the controller died. A clean close says so first."""

from __future__ import annotations

import subprocess


def stop_guardian(guardian: subprocess.Popen[bytes]) -> None:
    """The adapter's clean end: the guardian leaves the sandboxes alone and exits."""
    assert guardian.stdin is not None
    try:
        guardian.stdin.write(b"closed")
        guardian.stdin.close()
    except OSError:  # it died already
        pass
    try:
        guardian.wait(5)
    except subprocess.TimeoutExpired:
        guardian.kill()  # our own child, by its handle
        guardian.wait()

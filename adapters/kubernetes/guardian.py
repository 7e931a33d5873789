"""The guardian: what deletes a dead controller's pods, so that they are gone, not only ended.

A pod ends itself when its controller dies (its shell's websocket closes, see
container_shell), but its object stays (phase Failed) until someone deletes it, and a pod
whose shell never attached (the controller died mid-create) runs its attach grace first. The
adapter starts a guardian on its first create, as a process of its own session (a Ctrl-C or
a kill of the controller's process group does not reach it), with a pipe from the controller
as stdin. It waits in a bare interpreter (``python -I -S``, the standard library only: a few
MB while the run lasts):

* the adapter's ``close`` writes a byte and closes the pipe: the guardian exits, doing nothing;
* the pipe closes with nothing written (the controller died, even by SIGKILL): it becomes
  ``python -m orchard_async.adapters.kubernetes.guardian`` (this module, with the adapter's
  imports), which for ``linger`` seconds deletes the controller's pods (by its run and
  controller labels) every POLL seconds; a pod made to outlive its controller (a reattach
  grace) only once it has ended, as another controller may have adopted it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import anyio
import msgspec

from orchard_async.adapters.kubernetes.config import KubernetesConfig
from orchard_async.kit import labels as names

POLL = 1.0
ENDED = ("Succeeded", "Failed")

# The waiting stage: nothing but the read; then the acting stage, by exec (same pid).
WAIT = "import os, sys\nif not sys.stdin.buffer.read():\n    os.execv(sys.argv[1], sys.argv[1:])\n"


def doomed(pods: list[dict], now_deleting: set[str]) -> list[str]:
    """The pods of a dead controller to delete now: all but those with a reattach grace that
    still run (they end themselves after it, unless adopted), and those being deleted."""
    names_: list[str] = []
    for pod in pods:
        metadata = pod["metadata"]
        name = metadata["name"]
        if name in now_deleting or metadata.get("deletionTimestamp"):
            continue
        ended = (pod.get("status") or {}).get("phase") in ENDED
        if names.REATTACH in (metadata.get("labels") or {}) and not ended:
            continue
        names_.append(name)
    return names_


def start(config: KubernetesConfig, selector: str, reattach_grace: float) -> subprocess.Popen[bytes] | None:
    """The guardian of the pods ``selector`` selects, for an adapter with ``config`` (its
    namespace and run id as the adapter resolved them); None when it could not be started.
    It lingers while a create sent may still make a pod (the API's retries), and while a pod
    with a reattach grace may still run (its grace, or the attach grace of one whose shell
    never attached)."""
    linger = config.api_retry_for + max(reattach_grace, config.attach_grace if reattach_grace else 0.0)
    act = [sys.executable, "-m", __name__, msgspec.json.encode(config).decode(), selector, str(linger)]
    # the acting stage imports what this process imports, from where it found it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path or os.getcwd() for path in sys.path)}
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", WAIT, *act],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    except OSError:
        return None


async def act(config: KubernetesConfig, selector: str, linger: float) -> None:
    from orchard_async.adapters.kubernetes.adapter import KubernetesAdapter  # the adapter starts this module

    adapter = KubernetesAdapter(config=config)
    deleting: set[str] = set()
    started = time.monotonic()
    try:
        while time.monotonic() < started + linger:
            try:
                await adapter._start()
                pods = await adapter.api.list_all(adapter.api.path("pods"), selector, "pod list for the guardian")
                for name in doomed(pods, deleting):
                    await adapter.api.delete(adapter.api.path("pods", name), f"pod {name} delete")
                    deleting.add(name)
            except Exception:  # noqa: BLE001 - whatever failed, the next poll tries again (the API server is busy or away)
                pods = [{}]
            if not pods and time.monotonic() > started + config.api_retry_for:
                return  # none left, and no create the controller sent can still make one
            await anyio.sleep(POLL)
    finally:
        await adapter.close()


if __name__ == "__main__":
    anyio.run(act, msgspec.json.decode(sys.argv[1], type=KubernetesConfig), sys.argv[2], float(sys.argv[3]))

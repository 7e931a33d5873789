"""The docker adapter's ``doctor``: the one line `orchard-async doctor` prints for docker, and what
it knows about daemon versions."""

from __future__ import annotations

import re

from orchard_async.adapters.docker.api import WHERE, DockerApi
from orchard_async.errors import AdapterUnavailable, BackendUnavailable, CreateFailed
from orchard_async.images import missing_image_hint


async def doctor(api: DockerApi, *, image: str, keepalive: float) -> str:
    """The docker adapter's ``doctor``: what the daemon ``api`` reaches is, and what a sandbox
    gets there. Asks on a client of its own, closed before it returns (the adapter's is left
    as it was). Raises AdapterUnavailable when no daemon answers."""
    probe = DockerApi(api.url, api.timeout)
    try:
        version = await probe.version()
        present = await probe.image_present(image)
    except (BackendUnavailable, CreateFailed) as exc:
        raise AdapterUnavailable(str(exc)) from None
    finally:
        await probe.close()
    state = "present" if present else f"MISSING ({missing_image_hint(image, WHERE)})"
    ending = f"ends {keepalive:g} s after its controller goes silent" if keepalive else "no keepalive"
    number = version.get("Version", "?")
    return (
        f"Docker {number} (API {version.get('ApiVersion', '?')}) at {probe.endpoint}; "
        f"default image {image} {state}; each sandbox: all capabilities dropped, no-new-privileges, "
        f"pids limit from spec.pids, no network unless spec.network='on', {ending}" + known_deadlock(number)
    )


def known_deadlock(version: str) -> str:
    """A warning for a daemon with libnetwork's lock-order deadlock (moby/moby#42545: two
    containers exiting at once can stop every later start; fixed in 20.10.27 and 23.0).
    Debian 12 ships 20.10.24."""
    major, minor, patch = ([int(part) for part in re.findall(r"\d+", version)] + [0, 0, 0])[:3]
    if (major, minor) < (20, 10) or ((major, minor) == (20, 10) and patch < 27):
        return (
            f"; WARNING: dockerd {version} can deadlock when many containers start and exit at once "
            "(moby/moby#42545): if creates then time out, restart it (scripts/docker-down.sh, scripts/docker-up.sh)"
        )
    return ""

"""The docker adapter's options: one typed struct, validated at the edge (``--adapter-options``)."""

from __future__ import annotations

import os
import tempfile
from typing import Annotated

import msgspec

from orchard_async.types import DEFAULT_OUTPUT_CAP

DEFAULT_IMAGE = "orchard/busybox:test"
API_TIMEOUT = 30.0  # any single daemon call
KEEPALIVE = 6.0  # seconds without a byte from the controller before a container ends itself
ATTACH_GRACE = 60.0  # well beyond the seconds an attach takes on a loaded daemon
SNAPSHOT_TTL = 6 * 3600.0  # a group's forks start within minutes of its snapshot


class DockerConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The docker adapter's options (``--adapter-options`` JSON in the CLI)."""

    image: str = DEFAULT_IMAGE  # default image when a spec names none
    url: str | None = None  # daemon address (else DOCKER_HOST, else the docker context or the default socket)
    run_id: str | None = None  # lease label (default: a fresh run id)
    owner: str | None = None  # lease label (default: user@host)
    # containers being created at once: a create waits mostly on the daemon's runc starts, so more in
    # flight overlap; 200 creates on 2 cores took 127 s at 8, 77 s at 16, 55 s at 32 (docs/performance.md)
    max_creating: Annotated[int, msgspec.Meta(ge=1)] = 32
    api_timeout: Annotated[float, msgspec.Meta(gt=0)] = API_TIMEOUT  # seconds any single daemon call may take
    read_only: bool = False  # read-only root file system; the workdir and the control dir get tmpfs mounts
    tmpfs: dict[str, str] = {}  # {path: mount options}: extra tmpfs mounts (executable unless 'noexec')
    # end the container when its shell ends; False keeps it until its TTL (tests of the TTL and reap paths)
    exit_with_shell: bool = True
    # seconds without a byte from this controller after which a container ends itself (0: off; needs
    # exit_with_shell); at least 1: heartbeats go out every second
    keepalive: Annotated[float, msgspec.Meta(ge=0, le=86400)] = KEEPALIVE
    attach_grace: Annotated[float, msgspec.Meta(gt=0)] = ATTACH_GRACE  # a started container's wait for its shell
    # seconds a container outlives its controller, for another to ``attach`` (0: it ends at once; needs
    # exit_with_shell). What ``orchard-async serve`` uses to re-adopt its sandboxes after a restart.
    reattach_grace: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 0.0
    # seconds a snapshot (adapter.snapshot) lives when its run does not drop it: `reap` removes it after
    # that even while its controller lives (a dead controller's go at once)
    snapshot_ttl: Annotated[float, msgspec.Meta(gt=0)] = SNAPSHOT_TTL
    output_cap: Annotated[int, msgspec.Meta(ge=0)] = DEFAULT_OUTPUT_CAP  # bytes kept per output stream
    # a sandbox without network (spec.network off) gets a network namespace of its own from runc, with
    # loopback only, and not the daemon's libnetwork sandbox: no prestart hook (a re-exec of dockerd) per
    # container, ~0.06 CPU-s less in runc alone (docs/performance.md). /etc/hosts is then a read-only
    # bind of a per-user file (localhost, as docker's own for network none). False: the daemon's
    # network "none" (its writable /etc/hosts and resolv.conf), e.g. for a daemon on another machine.
    light_network: bool = True

    def __post_init__(self) -> None:
        if 0 < self.keepalive < 1:
            raise ValueError(f"keepalive must be 0 (off) or at least 1 second, got {self.keepalive}")


# What docker writes to /etc/hosts for a container with network "none"; light_network binds it.
HOSTS = """127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
ff00::0\tip6-mcastprefix
ff02::1\tip6-allnodes
ff02::2\tip6-allrouters
"""


def hosts_dir() -> str:
    """The directory with the /etc/hosts of light-network sandboxes: one per user, kept (a
    controller that is killed leaves nothing new behind), made private and checked to be this
    user's own (another user's could feed our sandboxes names); a fresh private one otherwise.
    The file is bound read-only into every container, so no sandbox can change what another
    resolves; it is rewritten (atomically: running containers keep theirs) when it differs."""
    path = os.path.join(tempfile.gettempdir(), f"orchard-docker-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        path = tempfile.mkdtemp(prefix="orchard-docker-")
    hosts = os.path.join(path, "hosts")
    try:
        with open(hosts) as fh:
            if fh.read() == HOSTS:
                return path
    except OSError:
        pass
    fd, staged = tempfile.mkstemp(dir=path)
    with os.fdopen(fd, "w") as fh:
        fh.write(HOSTS)
    os.chmod(staged, 0o644)
    os.replace(staged, hosts)
    return path

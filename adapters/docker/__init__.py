"""The docker adapter: one container per sandbox, driven over one long-lived exec.

The package, bottom up (each module imports only those above it):

* ``config``: ``DockerConfig``, the adapter's options as a checked struct, and the hosts file
  of light-network sandboxes;
* ``api``: ``DockerApi``, the daemon: one aiodocker client, every call under a timeout, the
  calls the others make (images, containers, execs and their attach streams);
* ``fork``: ``Forks``, the snapshots (commits to local images) one adapter made;
* ``container``: a sandbox container's create body (the self-destruct timer, limits, mounts);
* ``attach``: finding sandboxes by label and checking one for a new session (reattach);
* ``doctor``: the line `orchard-async doctor` prints, and what it knows of daemon versions;
* ``guardian``: the process that removes a dead controller's never-started containers;
* ``adapter``: ``DockerAdapter``, which ties them to the core's container shell.

A sandbox is a container whose main process is a self-destruct timer (``sleep`` under
Docker's init, created with AutoRemove). Commands never pay a ``docker exec`` each: at
creation one exec runs ``sh -s`` and its attach stream carries the shell-session
protocol (orchard_async.kit.shell), the same code the local adapter speaks over pipes. File
operations are commands too, so they work on tmpfs mounts and read-only roots, where
the archive API does not. Command output comes back through two relays (container_shell's
RELAY): in the container's main process, read over an attach made between create and start
(``RELAYS_IN_MAIN``), except for a sandbox that outlives its controller (reattach mode), whose
relays are execs a later controller can open again. Every exec is a runc process start for
the daemon: a create costs one (the shell), not three.

Forks (fork.py): ``snapshot`` commits a container to a local image with the
run's lease labels, a create with ``spec.snapshot`` starts from it, ``drop_snapshot`` and
``reap`` remove it.

Lifetimes, from the most to the least graceful end:

* ``sandbox.close()`` removes the container (force) and waits for the daemon to confirm.
* When the exec stream closes (the controller died, even by SIGKILL) or the shell dies,
  the exec's wrapper kills the timer, init exits with it, and AutoRemove deletes the
  container: a dead controller's sandboxes go within a second.
* Keepalive: the controller writes a newline (an empty command to the shell) on every
  exec stream that was idle for a second, and the exec's wrapper ends the container when
  no byte arrived for ``keepalive`` seconds (default 6). So a controller that died without
  its streams closing (the daemon kept the exec's stdin open; the process froze) loses its
  sandboxes within ``keepalive`` + 1.5 s too, not at their TTL.
* The container's stdin is the controller's too: an attach made between create and start,
  with StdinOnce, so the daemon closes it when that connection goes; a watch in the main
  process (container.CONTROLLER_WATCH) then ends the container. It covers a controller that
  died after the start but before its shell attached, and does not depend on the daemon
  closing an exec's stdin. A container created but never started runs nothing that could
  end it: the adapter's guardian (guardian.py, a process of its own started on the first
  create) removes those when the controller dies. Measured (`bench chaos`, 48 episodes, 16
  at once, three SIGKILLs): every container gone within 3.3 s, before any reap.
  With a reattach grace the watch waits the grace first, and ends the container only if
  no shell attached meanwhile.
* Behind all that, a container whose shell never attached ends after the attach grace
  (60 s), and any other at its TTL, whatever happened.
* ``reap`` removes, by label, containers whose controller process is dead (it is named
  by ``orchard.controller=<host>:<pid>:<start time>``) or whose TTL has passed.

Hardening: every capability is dropped (the shell protocol needs none: it signals and
reads /proc only for processes of its own user), no-new-privileges is set (setuid binaries
gain nothing), ``spec.pids`` is the container's pids cgroup limit (plus the adapter's own
processes), and the network is ``none`` unless the spec asks for it. Without network the
container's namespace is runc's own, loopback only (``light_network``, the default): the
daemon's libnetwork sandbox for ``none`` costs a prestart hook per container (a re-exec of
dockerd inside runc's create) for the same isolation. Docker then writes no /etc/hosts, so
the adapter binds its own there, read-only: localhost resolves as it does with ``none``.

Every daemon call runs under a timeout. A daemon that stalls or dies surfaces as
``BackendUnavailable`` (creates; the pool backs off) or ``sandbox_lost`` results
(running sandboxes); both are infrastructure errors the rollout engine retries.

Connection: ``url=`` or ``DOCKER_HOST``, else what aiodocker finds (a docker context,
then the default sockets), as the docker CLI does. Podman's Docker API socket
(``DOCKER_HOST=unix:///run/podman/podman.sock``) speaks the same endpoints used here;
it was not available on the reference machine, so it is untested.
"""

from __future__ import annotations

from orchard_async.adapters.docker.adapter import DockerAdapter
from orchard_async.adapters.docker.api import DockerApi
from orchard_async.adapters.docker.config import DockerConfig

__all__ = ["DockerAdapter", "DockerApi", "DockerConfig"]

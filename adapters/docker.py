"""The docker adapter: one container per sandbox, driven over one long-lived exec.

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

Forks (adapters/docker_fork.py): ``snapshot`` commits a container to a local image with the
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
* A container whose shell never attached (the controller died mid-create) ends after
  the attach grace (60 s); any other ends at its TTL, whatever happened.
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

import contextlib
import functools
import json
import os
import socket
import time
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

import aiodocker
import aiohttp
import anyio
import msgspec
import yarl
from aiodocker.containers import DockerContainer
from aiodocker.stream import Stream
from aiodocker.types import SENTINEL

from orchard_async.adapters.docker_config import DockerConfig, hosts_dir
from orchard_async.adapters.docker_container import container_config
from orchard_async.adapters.docker_fork import (
    SNAPSHOT_REPO,
    check_snapshot_id,
    drop_snapshot,
    reap_snapshots,
    snapshot,
)
from orchard_async.errors import BackendUnavailable, ConfigError, CreateFailed, SandboxLost
from orchard_async.images import ImageMissing, build_command, missing_image_hint
from orchard_async.kit import container_reattach
from orchard_async.kit import labels as names
from orchard_async.kit.background import Background, BackgroundOwner
from orchard_async.kit.container_shell import (
    DEFAULT_WORKDIR,
    SHELL_ONLY,
    concurrently,
    container_sandbox,
    is_abandoned,
    shell_command,
    start_shell,
)
from orchard_async.kit.exec_streams import (
    DuplexStream,
    ExecStream,
    Heartbeat,
    OutputStream,
    SplitRelay,
    close_streams,
)
from orchard_async.kit.sandbox import ShellSandbox
from orchard_async.kit.shell import CgroupShellClient
from orchard_async.protocols import Sandbox
from orchard_async.types import SandboxSpec

T = TypeVar("T")

WHERE = "the Docker daemon"

PULL_TIMEOUT = 600.0
INTERRUPT_TIMEOUT = 5.0  # signalling a timed-out command
DESTROY_TIMEOUT = 20.0


class AttachConnection:
    """An aiodocker exec attach stream as the container shell's ExecConnection."""

    def __init__(self, stream: Stream):
        self._stream = stream

    async def read(self) -> tuple[int, bytes] | None:
        message = await self._stream.read_out()
        return None if message is None else (message.stream, message.data)

    async def write(self, data: bytes) -> None:
        # aiodocker's write has no timeout (the stream bounds it) and fails with
        # AssertionError or RuntimeError once the connection is gone.
        await self._stream.write_in(data)

    def write_eof(self) -> None:
        """Half-close the connection: the daemon closes the process's stdin (as ``docker
        exec -i`` does at the end of its input). aiodocker has no call for it, so this
        reaches its connection's transport."""
        response = getattr(self._stream, "_resp", None)
        transport = response.connection.transport if response is not None and response.connection else None
        if transport is None or not transport.can_write_eof():
            raise anyio.BrokenResourceError("the exec stream is gone")
        transport.write_eof()

    async def close(self) -> None:
        await self._stream.close()


# -- the adapter ----------------------------------------------------------------------------


class DockerAdapter(BackgroundOwner):
    """Sandboxes as Docker containers, configured by a DockerConfig (or its fields by keyword).
    Hold it as ``async with DockerAdapter(...) as adapter:`` (or ``close()`` it): its exec
    readers and keepalive heartbeat run in its task group (orchard_async.kit.background)."""

    name = "docker"

    def __init__(self, config: DockerConfig | None = None, **options: Any):
        try:
            config = config or msgspec.convert(options, DockerConfig)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"bad option for the docker adapter: {exc}") from None
        self.config = config
        self.image = config.image
        self.url = config.url or os.environ.get("DOCKER_HOST") or None
        self.run_id = config.run_id or uuid.uuid4().hex[:12]
        self.owner = config.owner or f"{os.environ.get('USER', 'user')}@{socket.gethostname()}"
        self.api_timeout = config.api_timeout
        self.keepalive = float(config.keepalive) if config.exit_with_shell else 0.0
        self.reattach_grace = float(config.reattach_grace) if config.exit_with_shell else 0.0
        self.controller = names.controller_id()
        # Event-loop objects are made on first use: the constructor may run outside a loop.
        self._docker: aiodocker.Docker | None = None
        self._connecting: anyio.Lock | None = None
        self._endpoint = self.url or "the default Docker socket"
        self._create_gate: anyio.Semaphore | None = None
        self._image_locks: dict[str, anyio.Lock] = {}
        self._images_ready: set[str] = set()
        # the answer for an image (and pull policy) is cached, not asked per create
        self._images_missing: dict[tuple[str, str], ImageMissing] = {}
        self._live: dict[str, ShellSandbox] = {}
        self._background = Background()
        self._heartbeat = Heartbeat(self.keepalive, self._background)
        self._unremoved: set[str] = set()  # destroyed, but the daemon did not confirm removal
        self._snapshots: set[str] = set()  # made and not dropped: close drops them (they belong to the run)
        self._light_network = config.light_network
        self._hosts_dir: str | None = None  # holds the /etc/hosts of light-network sandboxes (docker_config.hosts_dir)

    # -- daemon access ------------------------------------------------------------------------

    async def _client(self) -> aiodocker.Docker:
        if self._docker is None:
            # Concurrent first calls must share one client: connecting awaits.
            self._connecting = self._connecting or anyio.Lock()
            async with self._connecting:
                if self._docker is None:
                    self._create_gate = anyio.Semaphore(self.config.max_creating)
                    self._docker = await self._connect()
        return self._docker

    async def _connect(self) -> aiodocker.Docker:
        """aiodocker's client, with an unbounded connection pool on unix sockets: each live
        sandbox holds one connection (its exec stream), and aiohttp's default pool of 100
        would make the 101st sandbox wait forever."""
        timeout = aiohttp.ClientTimeout(sock_connect=10)
        try:
            docker = aiodocker.Docker(url=self.url, timeout=timeout)
        except AssertionError:  # aiodocker's way to say it found no socket (the daemon is restarting, or absent)
            raise self._unreachable("connect", "no Docker socket found") from None
        if not isinstance(docker.connector, aiohttp.UnixConnector):
            self._light_network = False  # a daemon elsewhere cannot bind this machine's /etc/hosts file
            return docker  # tcp/ssh/tls: aiodocker's pool (at most ~100 live sandboxes)
        path = docker.connector.path
        await docker.close()
        self._endpoint = f"unix://{path}"
        # The client does not close a connector it was given (see _disconnect).
        return aiodocker.Docker(
            url="unix://localhost",  # aiodocker's placeholder host for socket URLs
            connector=aiohttp.UnixConnector(path=path, limit=0),
            timeout=timeout,
        )

    @staticmethod
    async def _disconnect(docker: aiodocker.Docker) -> None:
        await docker.close()
        await docker.connector.close()  # a no-op when aiodocker already closed its own

    async def _call(self, what: str, call: Awaitable[T], limit: float | None = None) -> T:
        """One daemon call under a timeout; an unreachable or stalled daemon becomes
        BackendUnavailable. HTTP errors (aiodocker.DockerError) are left to the caller."""
        limit = limit or self.api_timeout
        try:
            with anyio.fail_after(limit):
                return await call
        except TimeoutError:
            raise BackendUnavailable(
                f"the Docker daemon at {self._endpoint} did not answer {what} within {limit:.0f}s "
                "(if it stays so, `orchard-async doctor` says whether its version can deadlock)"
            ) from None
        except aiodocker.DockerError as exc:
            if exc.status == 900:  # aiodocker's code for "could not connect"
                raise self._unreachable(what, exc.message) from None
            raise
        except (aiohttp.ClientError, OSError) as exc:
            raise self._unreachable(what, str(exc) or type(exc).__name__) from None

    def _unreachable(self, what: str, why: str) -> BackendUnavailable:
        return BackendUnavailable(
            f"cannot reach the Docker daemon at {self._endpoint} ({what}): {why}; "
            "start it (scripts/docker-up.sh here) or point DOCKER_HOST at it"
        )

    # -- create ---------------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> Sandbox:
        docker = await self._client()
        assert self._create_gate is not None
        image = spec.snapshot or spec.image or self.image
        async with self._create_gate:  # admission control: the daemon serialises creates
            if spec.snapshot:
                check_snapshot_id(spec.snapshot)  # a local image: no pull policy applies
            else:
                await self._ensure_image(docker, image, spec.pull)
            name = f"orchard-{uuid.uuid4().hex[:16]}"
            expires_at = time.time() + spec.ttl
            labels = self._labels(spec, expires_at)
            config = self._container_config(spec, image, labels)
            try:
                container, split = await self._start_container(docker, name, config)
            except ConfigError as exc:
                if not self._light_network_refused(config, exc):
                    raise
                config = self._container_config(spec, image, labels)  # the daemon's network "none"
                container, split = await self._start_container(docker, name, config)
            try:
                client, relays = await self._open_shell(container, self._workdir(spec), name, split)
            except BaseException:
                self._heartbeat.discard(name)
                await self._remove(name)
                raise
        return self._sandbox(container, name, client, relays, labels, expires_at)

    def _sandbox(
        self,
        container: DockerContainer,
        name: str,
        client: CgroupShellClient,
        relays: list[OutputStream],
        labels: dict[str, str],
        expires_at: float,
    ) -> ShellSandbox:
        async def teardown() -> None:
            self._live.pop(name, None)
            self._heartbeat.discard(name)
            # Remove first: closing the stream first would make the container end itself
            # (exit_with_shell) and race our removal with AutoRemove's.
            await self._remove(name)
            await client.close()
            await close_streams(relays)

        opener = functools.partial(self._open_stream, container)
        sandbox = self._live[name] = container_sandbox(
            name, client, labels, expires_at, teardown=teardown, open_stream=opener
        )
        return sandbox

    def _labels(self, spec: SandboxSpec, expires_at: float) -> dict[str, str]:
        lease = names.lease_labels(owner=self.owner, run=self.run_id, expires_at=expires_at, controller=self.controller)
        if self.reattach_grace:
            lease[names.REATTACH] = str(self.reattach_grace)
        return {**spec.labels, **lease}

    def _workdir(self, spec: SandboxSpec) -> str:
        return spec.workdir or DEFAULT_WORKDIR

    def _container_config(self, spec: SandboxSpec, image: str, labels: dict[str, str]) -> dict[str, Any]:
        light = spec.network != "on" and self._light_network
        return container_config(
            self.config,
            spec,
            image,
            labels,
            workdir=self._workdir(spec),
            relays_in_main=self._relays_in_main,
            reattach_grace=self.reattach_grace,
            hosts_file=self._hosts_file() if light else None,
        )

    def _light_network_refused(self, config: dict[str, Any], exc: ConfigError) -> bool:
        """Whether the daemon refused the bind of our /etc/hosts (it runs where this file is not:
        another machine, a VM): light networking is then off for this adapter."""
        if not config.get("NetworkDisabled") or self._hosts_dir is None or self._hosts_dir not in str(exc):
            return False
        self._light_network = False
        return True

    def _hosts_file(self) -> str:
        if self._hosts_dir is None:
            self._hosts_dir = hosts_dir()
        return os.path.join(self._hosts_dir, "hosts")

    async def _ensure_image(self, docker: aiodocker.Docker, image: str, pull: str) -> None:
        """Apply the pull policy once per image per adapter: never pull what was not asked
        for, and never try a registry for an image that ``orchard-async images build``
        makes (no registry has it). A missing image is remembered too: later creates fail
        at once with the same one-line ImageMissing, without asking the daemon again."""
        if image in self._images_ready:
            return
        if (image, pull) in self._images_missing:
            raise self._images_missing[image, pull]
        lock = self._image_locks.setdefault(image, anyio.Lock())
        async with lock:
            if image in self._images_ready:
                return
            if (image, pull) in self._images_missing:
                raise self._images_missing[image, pull]
            present = await self._image_present(docker, image)
            try:
                if pull == "always" or (pull == "missing" and not present):
                    if build_command(image) and not present:
                        raise ImageMissing(f"image {image} is not on {WHERE}; {missing_image_hint(image, WHERE)}")
                    await self._pull(docker, image)
                elif not present:
                    raise ImageMissing(
                        f"image {image} is not on {WHERE} and the spec says pull='never'; "
                        f"{missing_image_hint(image, WHERE)}"
                    )
            except ImageMissing as exc:
                self._images_missing[image, pull] = exc
                raise
            self._images_ready.add(image)

    async def _image_present(self, docker: aiodocker.Docker, image: str) -> bool:
        try:
            await self._call(f"inspect of image {image}", docker.images.inspect(image))
        except aiodocker.DockerError as exc:
            if exc.status == 404:
                return False
            raise CreateFailed(f"inspecting image {image!r} failed: {exc}") from None
        return True

    async def _pull(self, docker: aiodocker.Docker, image: str) -> None:
        try:
            await self._call(f"pull of {image}", docker.images.pull(image), PULL_TIMEOUT)
        except aiodocker.DockerError as exc:
            raise ImageMissing(
                f"image {image} is not on {WHERE} and could not be pulled ({exc.message.strip()}); "
                f"{missing_image_hint(image, WHERE)}"
            ) from None

    @property
    def max_creating(self) -> int:
        """Containers created at once (the create gate): what `bench create` gives `docker run -d` too."""
        return self.config.max_creating

    @property
    def _relays_in_main(self) -> bool:
        """The output relays run in the container's main process, read over an attach made
        before its start (two fewer execs per create: see RELAYS_IN_MAIN). Not for a sandbox
        that outlives its controller: an attach cannot be handed over, an exec can."""
        return self.config.exit_with_shell and not self.reattach_grace

    async def _start_container(
        self, docker: aiodocker.Docker, name: str, config: dict[str, Any]
    ) -> tuple[DockerContainer, SplitRelay | None]:
        """Create and start the container; with relays in its main process, attach to its
        output in between (nothing it prints is missed)."""
        split = None
        try:
            container = await self._call("container create", docker.containers.create(config, name=name))
            if self._relays_in_main:
                split = SplitRelay(await self._attach_main(docker, container))
            await self._call("container start", container.start())
        except BaseException as exc:
            # Even a create that failed may have made the container (its answer was lost).
            await self._remove(name)
            if split is not None:
                await split.close()
            if isinstance(exc, aiodocker.DockerError):
                raise self._create_error(config["Image"], exc) from None
            raise
        return container, split

    async def _attach_main(self, docker: aiodocker.Docker, container: DockerContainer) -> AttachConnection:
        """Attach to the main process's stdout and stderr (aiodocker's ``attach`` would first
        inspect the container for its tty setting: it has none)."""

        async def setup() -> tuple[yarl.URL, None, bool]:
            query = {"stream": 1, "stdin": 0, "stdout": 1, "stderr": 1, "logs": 0, "detachKeys": ""}
            return yarl.URL(f"containers/{container.id}/attach").with_query(query), None, False

        stream = Stream(docker, setup, docker._resolve_long_running_timeout(SENTINEL))
        await self._call("container attach", stream.__aenter__())  # upgrades the HTTP connection
        return AttachConnection(stream)

    @staticmethod
    def _create_error(image: str, exc: aiodocker.DockerError) -> Exception:
        """The daemon refuses a bad request (an image vanished, a limit it cannot apply) with
        4xx: retrying cannot help, so it is the caller's to fix. 5xx may pass: retry."""
        if exc.status == 404 and image.startswith(f"{SNAPSHOT_REPO}:"):
            return ConfigError(f"snapshot {image} is not on {WHERE}: it was dropped, or another daemon made it")
        if exc.status == 404:
            return ImageMissing(
                f"image {image} is not on {WHERE} ({exc.message.strip()}); {missing_image_hint(image, WHERE)}"
            )
        if 400 <= exc.status < 500:
            return ConfigError(f"the Docker daemon refused the sandbox spec: {exc.message}")
        return CreateFailed(f"the Docker daemon failed to create the container: {exc.message}")

    async def _attach(
        self, container: DockerContainer, command: list[str], what: str, *, stdin: bool
    ) -> AttachConnection:
        """Create and start an exec, attached (stdout and stderr; stdin when asked)."""
        try:
            execution = await self._call(
                f"{what} exec create", container.exec(command, stdin=stdin, stdout=True, stderr=True, tty=False)
            )
            attach = execution.start(detach=False)
            await self._call(f"{what} exec start", attach.__aenter__())  # upgrades the HTTP connection
        except aiodocker.DockerError as exc:
            raise CreateFailed(f"could not start the sandbox {what}: {exc.message}") from None
        return AttachConnection(attach)

    async def _open_shell(
        self, container: DockerContainer, workdir: str, name: str, split: SplitRelay | None = None
    ) -> tuple[CgroupShellClient, list[OutputStream]]:
        """Start the long-lived shell exec, its output relays, and the shell-session server."""
        if not self.config.exit_with_shell:
            command = SHELL_ONLY
        elif self.reattach_grace:
            command = container_reattach.shell_command(self.keepalive, self.reattach_grace)
        else:
            command = shell_command(self.keepalive)
        stream = ExecStream(await self._attach(container, command, "shell", stdin=True), self._background)
        if self.keepalive:  # from the first byte: the watchdog is already counting
            self._heartbeat.add(name, stream)

        async def open_output(command: list[str]) -> OutputStream:
            return OutputStream(await self._attach(container, command, "output relay", stdin=False))

        return await start_shell(
            stream,
            workdir=workdir,
            open_output=split or open_output,
            interrupt=lambda _client: self._interrupt(container),
            output_cap=self.config.output_cap,
            mount="a tmpfs",
        )

    async def _open_stream(self, container: DockerContainer, sandbox: Sandbox, command: list[str]) -> DuplexStream:
        """One exec with stdin attached: ``open_stream``'s transport."""
        try:
            return DuplexStream(await self._attach(container, command, "stream", stdin=True))
        except CreateFailed as exc:  # the container is gone, or the daemon refused the exec
            raise SandboxLost(f"no stream into {sandbox.id}: {exc}") from None

    async def _interrupt(self, container: DockerContainer) -> None:
        """Deliver the client's timeout interrupt: SIGUSR1 to the container, which its
        timer relays to the shell (see docker_container.TIMER). If the daemon cannot do it in time, the
        client's grace period declares the sandbox lost."""
        with contextlib.suppress(BackendUnavailable, aiodocker.DockerError):
            await self._call("interrupt", container.kill(signal="SIGUSR1"), INTERRUPT_TIMEOUT)

    # -- destroy, reap, close -----------------------------------------------------------------

    async def _remove(self, name: str) -> bool:
        """Remove a container; never raises. What the daemon could not confirm is retried
        by ``close`` (and ends at its TTL anyway)."""
        with anyio.CancelScope(shield=True):
            try:
                await self._delete(name)
            except (BackendUnavailable, aiodocker.DockerError):
                self._unremoved.add(name)
                return False
        self._unremoved.discard(name)
        return True

    async def _delete(self, name: str) -> None:
        """Force-remove a container; return once the daemon confirms it is gone."""
        container = (await self._client()).containers.container(name)
        try:
            await self._call(f"removal of {name}", container.delete(force=True), DESTROY_TIMEOUT)
            return
        except aiodocker.DockerError as exc:
            if exc.status == 404:  # already gone: AutoRemove won the race
                return
            if exc.status != 409:
                raise
        # 409: a removal is already under way (AutoRemove's): wait for it to finish.
        try:
            await self._call(f"wait for removal of {name}", container.wait(condition="removed"), DESTROY_TIMEOUT)
        except aiodocker.DockerError as exc:
            if exc.status != 404:
                raise

    async def attach(self, sandbox_id: str) -> Sandbox:
        """A new shell session on a live sandbox another controller made with a reattach grace
        (and that controller gone): SandboxLost when it ended or expired (removed then), or was
        made without one; CreateFailed while another controller's session is alive."""
        from orchard_async.adapters.docker_attach import attach

        return await attach(self, sandbox_id)

    async def find_sandboxes(self, labels: dict[str, str]) -> dict[str, dict[str, str]]:
        """Sandboxes (anyone's, live or ended but not yet removed) carrying every one of
        ``labels``: id -> their labels."""
        from orchard_async.adapters.docker_attach import find_sandboxes

        return await find_sandboxes(self, labels)

    async def snapshot(self, sandbox: Sandbox) -> str:
        """Freeze the sandbox's file system as a local image (see adapters/docker_fork.py); its id
        is what ``SandboxSpec.snapshot`` takes."""
        return await snapshot(self, sandbox)

    async def drop_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot image and its layer; idempotent."""
        await drop_snapshot(self, snapshot_id)

    async def list_owned(self) -> list[str]:
        """Live sandboxes, and destroyed ones whose removal the daemon has not confirmed."""
        return sorted(set(self._live) | self._unremoved)

    async def reap(self, older_than: float = 0.0) -> list[str]:
        """Remove orchard containers (anyone's, on this daemon) whose controller is dead,
        whose TTL passed ``older_than`` seconds ago, or that stopped and were not removed."""
        docker = await self._client()
        filters = json.dumps({"label": [names.OWNER]})
        containers = await self._call("container list", docker.containers.list(all=True, filters=filters))
        now = time.time()
        doomed = []
        for container in containers:  # entries of the list endpoint: Names, Labels, State
            name = container["Names"][0].lstrip("/")
            labels, state = container["Labels"] or {}, container["State"]
            alive = names.controller_alive(labels.get(names.CONTROLLER, ""))
            # exited or dead and never removed (e.g. the daemon restarted under it): of no use
            ended = state in ("exited", "dead")
            if name not in self._live and is_abandoned(
                labels, ended=ended, controller_alive=alive, now=now, older_than=older_than
            ):
                doomed.append(name)
        removed: list[str] = []

        async def remove(name: str) -> None:
            if await self._remove(name):
                removed.append(name)

        await concurrently(*(functools.partial(remove, name) for name in doomed))
        # after the containers: a fork keeps its snapshot image in use
        return sorted(removed) + await reap_snapshots(self, older_than)

    async def close(self) -> None:
        """Destroy every live sandbox, retry unconfirmed removals, close the connection."""
        with anyio.CancelScope(shield=True):
            closes = [sandbox.close for sandbox in self._live.values()]
            await concurrently(*closes, *(functools.partial(self._remove, name) for name in list(self._unremoved)))
            for snapshot_id in list(self._snapshots):  # their forks are gone now
                await drop_snapshot(self, snapshot_id, quiet=True)
            await self._background.close()
            if self._docker is not None:
                await self._disconnect(self._docker)
                self._docker = None

    async def doctor(self) -> str:
        """One line for `orchard-async doctor`; raises AdapterUnavailable when no daemon answers."""
        from orchard_async.adapters.docker_doctor import doctor

        return await doctor(self)

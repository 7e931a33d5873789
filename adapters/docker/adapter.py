"""``DockerAdapter``: sandboxes as containers, made and driven over the daemon ``api``
(api.py), shaped by ``container`` and ``config``, forked by ``fork``, taken over by ``attach``.
See the package's docstring for the whole picture."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import time
import uuid
from typing import Any

import aiodocker
import anyio
import msgspec
from aiodocker.containers import DockerContainer

from orchard_async.adapters.docker import guardian
from orchard_async.adapters.docker.api import WHERE, AttachConnection, DockerApi
from orchard_async.adapters.docker.attach import adoptable, find_sandboxes
from orchard_async.adapters.docker.config import DockerConfig, hosts_dir
from orchard_async.adapters.docker.container import (
    container_config,
    reap_ttl_dirs,
    remove_ttl_dir,
    ttl_deadline,
    write_deadline,
)
from orchard_async.adapters.docker.doctor import doctor
from orchard_async.adapters.docker.fork import SNAPSHOT_REPO, Forks, check_snapshot_id
from orchard_async.capabilities import AdapterFacts, Doctor, Facts, NetworkPolicy, Reattach, Snapshots, spec_network
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
from orchard_async.kit.egress import NamespaceEgress, NetworkSwitch, forwarding_note, namespace_refusal
from orchard_async.kit.exec_streams import DuplexStream, ExecStream, Heartbeat, OutputStream, SplitRelay, close_streams
from orchard_async.kit.guardian import stop_guardian
from orchard_async.kit.sandbox import ShellSandbox
from orchard_async.kit.shell import CgroupShellClient
from orchard_async.protocols import Sandbox
from orchard_async.types import SandboxSpec


class DockerAdapter(BackgroundOwner):
    """Sandboxes as Docker containers, configured by a DockerConfig (or its fields by keyword).
    Hold it as ``async with DockerAdapter(...) as adapter:`` (or ``close()`` it): its exec
    readers and keepalive heartbeat run in its task group (orchard_async.kit.background)."""

    name = "docker"
    capabilities = frozenset({Snapshots, Reattach, Doctor, Facts})

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
        self.api = DockerApi(self.url, config.api_timeout)
        self.forks = Forks(self.api)
        # Event-loop objects are made on first use: the constructor may run outside a loop.
        self._create_gate: anyio.Semaphore | None = None
        self._image_locks: dict[str, anyio.Lock] = {}
        self._images_ready: set[str] = set()
        # the answer for an image (and pull policy) is cached, not asked per create
        self._images_missing: dict[tuple[str, str], ImageMissing] = {}
        self._live: dict[str, ShellSandbox] = {}
        self._background = Background()
        self._heartbeat = Heartbeat(self.keepalive, self._background)
        self._unremoved: set[str] = set()  # destroyed, but the daemon did not confirm removal
        self._light_network = config.light_network  # off once the daemon refused our /etc/hosts bind
        self._hosts_dir: str | None = None  # holds the /etc/hosts of light-network sandboxes (config.hosts_dir)
        self._binds_refused = False  # the daemon refused a bind of our files: no light network, no TTL extension
        # removes this adapter's never-started containers if the process dies (guardian.py)
        self._guardian: subprocess.Popen[bytes] | None = None
        self._guarded = False
        self._gpus: int | None = None  # the daemon's GPUs: -1 some (the nvidia runtime), None not asked yet

    @property
    def facts(self) -> AdapterFacts:
        return AdapterFacts(image=self.image, max_creating=self.config.max_creating)

    # -- create ---------------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> ShellSandbox:
        await self.api.client()  # connected first: whether the daemon shares this machine decides the network
        if not self._guarded:
            self._guarded = True
            self._guardian = guardian.start(self.api.endpoint, self.controller, self.run_id)
        if spec.gpus:
            await self._check_gpus(spec.gpus)
        self._create_gate = self._create_gate or anyio.Semaphore(self.config.max_creating)
        image = spec.snapshot or spec.image or self.image
        async with self._create_gate:  # admission control: the daemon serialises creates
            if spec.snapshot:
                check_snapshot_id(spec.snapshot)  # a local image: no pull policy applies
            else:
                await self._ensure_image(image, spec.pull)
            name = f"orchard-{uuid.uuid4().hex[:16]}"
            expires_at = time.time() + spec.ttl
            labels = self._labels(spec, expires_at)
            ttl = self._ttl_dir(name, expires_at) if spec.max_extension and self._host_binds else None
            config = self._container_config(spec, image, labels, ttl, expires_at + spec.max_extension)
            try:
                container, split, watch = await self._start_container(name, config)
            except ConfigError as exc:
                if not self._light_network_refused(config, exc):
                    remove_ttl_dir(ttl)
                    raise
                remove_ttl_dir(ttl)  # the daemon cannot bind our files: no deadline to extend either
                ttl = None
                config = self._container_config(spec, image, labels)  # the daemon's network "none"
                container, split, watch = await self._start_container(name, config)
            except BaseException:
                remove_ttl_dir(ttl)
                raise
            try:
                client, relays = await self._open_shell(
                    container, self._workdir(spec), name, split, writable_dirs=spec.writable_dirs
                )
            except BaseException:
                self._heartbeat.discard(name)
                await self._remove(name)
                remove_ttl_dir(ttl)
                if watch is not None:
                    await watch.close()
                raise
        network = spec_network(spec.network)
        return self._sandbox(
            container, name, client, relays, labels, expires_at, network, watch, ttl, spec.max_extension
        )

    def _ttl_dir(self, name: str, expires_at: float) -> str:
        """The host dir of an extendable sandbox's deadline (container.TTL_LOOP), the deadline in."""
        if self._hosts_dir is None:
            self._hosts_dir = hosts_dir()
        path = os.path.join(self._hosts_dir, "ttl", name)
        os.makedirs(path, mode=0o755)
        os.chmod(path, 0o755)  # the image's user, whoever it is, reads it; only we write it
        write_deadline(path, expires_at)
        return path

    def _ttl_refusal(self, ttl: str | None) -> str:
        if ttl is not None:
            return ""
        if not self._host_binds:
            return "the Docker daemon cannot bind this machine's files (it runs on another machine, or in a VM)"
        return "it was created with max_extension=0 (SandboxSpec.max_extension), or taken over from another controller"

    def _sandbox(
        self,
        container: DockerContainer,
        name: str,
        client: CgroupShellClient,
        relays: list[OutputStream],
        labels: dict[str, str],
        expires_at: float,
        network: NetworkPolicy,
        watch: AttachConnection | None = None,
        ttl: str | None = None,
        max_extension: float = 0.0,
    ) -> ShellSandbox:
        async def container_pid() -> int:
            details = await self.api.call("inspect", container.show())
            return int(details.get("State", {}).get("Pid") or 0)

        egress = NamespaceEgress(container_pid, name)

        async def teardown() -> None:
            self._live.pop(name, None)
            self._heartbeat.discard(name)
            # Remove first: closing the stream first would make the container end itself
            # (exit_with_shell) and race our removal with AutoRemove's.
            await self._remove(name)
            remove_ttl_dir(ttl)
            await client.close()
            await close_streams(relays)
            await egress.close()
            if watch is not None:
                with anyio.CancelScope(shield=True):
                    await watch.close()

        opener = functools.partial(self._open_stream, container)
        switch = NetworkSwitch(network, egress.enforce, refusal=self._network_refusal())

        async def extend(until: float) -> None:  # ShellSandbox.extend_ttl; the container's timer re-reads it
            assert ttl is not None
            write_deadline(ttl, until)

        sandbox = self._live[name] = container_sandbox(
            name,
            client,
            labels,
            expires_at,
            teardown=teardown,
            open_stream=opener,
            network=switch,
            ttl_extender=extend,
            max_extension=max_extension,
            ttl_refusal=self._ttl_refusal(ttl),
        )
        return sandbox

    async def _check_gpus(self, wanted: int) -> None:
        """Refuse a spec asking for GPUs the daemon cannot give, before any container exists
        (its own refusal would come only at start, as a server error): GPUs come from the
        nvidia runtime or from CDI devices named nvidia.com/gpu."""
        if self._gpus is None:
            info = await self.api.info()
            cdi = [d for d in info.get("DiscoveredDevices") or [] if str(d.get("ID", "")).startswith("nvidia.com/gpu")]
            self._gpus = len(cdi) if cdi else (-1 if "nvidia" in (info.get("Runtimes") or {}) else 0)
        if self._gpus == 0:
            raise ConfigError(
                f"the Docker daemon has no GPU to give (no nvidia runtime, no nvidia.com/gpu CDI device), so "
                f"gpus={wanted} cannot hold; install the NVIDIA Container Toolkit there, or ask for gpus=0"
            )
        if self._gpus > 0 and wanted > self._gpus:
            raise ConfigError(f"gpus={wanted}, but the Docker daemon has {self._gpus} GPU(s)")

    def _network_refusal(self) -> str:
        """Why a container's network cannot be switched from here ("" when it can): the rules go
        into its network namespace from the daemon's machine."""
        if not self.api.same_host:
            return "the Docker daemon runs on another machine: a container's network is switched from the daemon's"
        return namespace_refusal()

    def _labels(self, spec: SandboxSpec, expires_at: float) -> dict[str, str]:
        lease = names.lease_labels(owner=self.owner, run=self.run_id, expires_at=expires_at, controller=self.controller)
        if self.reattach_grace:
            lease[names.REATTACH] = str(self.reattach_grace)
        return {**spec.labels, **lease}

    def _workdir(self, spec: SandboxSpec) -> str:
        return spec.workdir or DEFAULT_WORKDIR

    def _container_config(
        self, spec: SandboxSpec, image: str, labels: dict[str, str], ttl: str | None = None, hard_cap: float = 0.0
    ) -> dict[str, Any]:
        light = spec.network != "on" and self._light_network and self.api.same_host
        return container_config(
            self.config,
            spec,
            image,
            labels,
            workdir=self._workdir(spec),
            relays_in_main=self._relays_in_main,
            reattach_grace=self.reattach_grace,
            hosts_file=self._hosts_file() if light else None,
            ttl_dir=ttl,
            hard_cap=hard_cap,
        )

    @property
    def _host_binds(self) -> bool:
        """Whether the daemon can bind files of this machine (it shares it, and did not refuse)."""
        return self.api.same_host and self._binds_refused is False

    def _light_network_refused(self, config: dict[str, Any], exc: ConfigError) -> bool:
        """Whether the daemon refused the bind of our /etc/hosts (it runs where this file is not:
        another machine, a VM): light networking is then off for this adapter."""
        if not config.get("HostConfig", {}).get("Mounts") or self._hosts_dir is None or self._hosts_dir not in str(exc):
            return False
        self._light_network = False
        self._binds_refused = True
        return True

    def _hosts_file(self) -> str:
        if self._hosts_dir is None:
            self._hosts_dir = hosts_dir()
        return os.path.join(self._hosts_dir, "hosts")

    async def _ensure_image(self, image: str, pull: str) -> None:
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
            present = await self.api.image_present(image)
            try:
                if pull == "always" or (pull == "missing" and not present):
                    if build_command(image) and not present:
                        raise ImageMissing(f"image {image} is not on {WHERE}; {missing_image_hint(image, WHERE)}")
                    await self.api.pull(image)
                elif not present:
                    raise ImageMissing(
                        f"image {image} is not on {WHERE} and the spec says pull='never'; "
                        f"{missing_image_hint(image, WHERE)}"
                    )
            except ImageMissing as exc:
                self._images_missing[image, pull] = exc
                raise
            self._images_ready.add(image)

    @property
    def _relays_in_main(self) -> bool:
        """The output relays run in the container's main process, read over an attach made
        before its start (two fewer execs per create: see RELAYS_IN_MAIN). Not for a sandbox
        that outlives its controller: an attach cannot be handed over, an exec can."""
        return self.config.exit_with_shell and not self.reattach_grace

    async def _start_container(
        self, name: str, config: dict[str, Any]
    ) -> tuple[DockerContainer, SplitRelay | None, AttachConnection | None]:
        """Create and start the container, attached in between to its stdin (the controller
        watch of container.py: the container ends when this connection goes) and, with relays
        in its main process, its output (nothing it prints is missed). Returns the container,
        the relays in its main process, and the stdin-only attach when there are none."""
        split = watch = None
        try:
            container = await self.api.create_container(name, config)
            if self._relays_in_main:
                split = SplitRelay(await self.api.attach_main(container))
            elif self.config.exit_with_shell:  # no output to read: the connection is only its stdin
                watch = await self.api.attach_main(container, output=False)
            await self.api.call("container start", container.start())
        except BaseException as exc:
            # Even a create that failed may have made the container (its answer was lost).
            await self._remove(name)
            if split is not None:
                await split.close()
            if watch is not None:
                await watch.close()
            if isinstance(exc, aiodocker.DockerError):
                raise self._create_error(config["Image"], exc) from None
            raise
        return container, split, watch

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

    async def _open_shell(
        self,
        container: DockerContainer,
        workdir: str,
        name: str,
        split: SplitRelay | None = None,
        *,
        writable_dirs: tuple[str, ...] = (),
    ) -> tuple[CgroupShellClient, list[OutputStream]]:
        """Start the long-lived shell exec, its output relays, and the shell-session server."""
        if not self.config.exit_with_shell:
            command = SHELL_ONLY
        elif self.reattach_grace:
            command = container_reattach.shell_command(self.keepalive, self.reattach_grace)
        else:
            command = shell_command(self.keepalive)
        stream = ExecStream(await self.api.attach_exec(container, command, "shell", stdin=True), self._background)
        if self.keepalive:  # from the first byte: the watchdog is already counting
            self._heartbeat.add(name, stream)

        async def open_output(command: list[str]) -> OutputStream:
            return OutputStream(await self.api.attach_exec(container, command, "output relay", stdin=False))

        return await start_shell(
            stream,
            workdir=workdir,
            open_output=split or open_output,
            # the client's timeout interrupt: its timer relays SIGUSR1 to the shell (container.TIMER)
            interrupt=lambda _client: self.api.interrupt(container),
            output_cap=self.config.output_cap,
            mount="a tmpfs",
            writable_dirs=writable_dirs,
        )

    async def _open_stream(self, container: DockerContainer, sandbox: Sandbox, command: list[str]) -> DuplexStream:
        """One exec with stdin attached: ``open_stream``'s transport."""
        try:
            return DuplexStream(await self.api.attach_exec(container, command, "stream", stdin=True))
        except CreateFailed as exc:  # the container is gone, or the daemon refused the exec
            raise SandboxLost(f"no stream into {sandbox.id}: {exc}") from None

    # -- destroy, reap, close -----------------------------------------------------------------

    async def _remove(self, name: str) -> bool:
        """Remove a container; never raises. What the daemon could not confirm is retried
        by ``close`` (and ends at its TTL anyway)."""
        with anyio.CancelScope(shield=True):
            try:
                await self.api.remove_container(name)
            except (BackendUnavailable, aiodocker.DockerError):
                self._unremoved.add(name)
                return False
        self._unremoved.discard(name)
        return True

    async def attach(self, sandbox_id: str) -> ShellSandbox:
        """A new shell session on a live sandbox another controller made with a reattach grace
        (and that controller gone): SandboxLost when it ended or expired (removed then), or was
        made without one; CreateFailed while another controller's session is alive."""
        if sandbox_id in self._live:
            return self._live[sandbox_id]
        found = await adoptable(self.api, sandbox_id, patience=self.keepalive + 5.0, remove=self._remove)
        try:
            client, relays = await self._open_shell(found.container, found.workdir, sandbox_id)
        except BaseException:
            self._heartbeat.discard(sandbox_id)
            raise
        details = await self.api.call("inspect", found.container.show())
        mode = details.get("HostConfig", {}).get("NetworkMode")
        # As it was created; a gone controller's switch is not known (the first change rewrites it all).
        network = spec_network(
            "on" if mode not in ("none", None) and not details.get("Config", {}).get("NetworkDisabled") else "none"
        )
        return self._sandbox(found.container, sandbox_id, client, relays, found.labels, found.expires_at, network)

    async def find_sandboxes(self, labels: dict[str, str]) -> dict[str, dict[str, str]]:
        """Sandboxes (anyone's, live or ended but not yet removed) carrying every one of
        ``labels``: id -> their labels."""
        return await find_sandboxes(self.api, labels)

    async def snapshot(self, sandbox: Sandbox) -> str:
        """Freeze the sandbox's file system as a local image (see fork.py); its id is what
        ``SandboxSpec.snapshot`` takes."""
        if self.config.read_only:
            raise ConfigError(
                "docker snapshots need a writable root: with read_only=True the work dir is a tmpfs, "
                "which a commit does not capture; set read_only=False to fork"
            )
        if sandbox.id not in self._live:
            raise ConfigError(f"sandbox {sandbox.id or sandbox!r} is not a live sandbox of this docker adapter")
        expires_at = time.time() + self.config.snapshot_ttl
        lease = names.lease_labels(owner=self.owner, run=self.run_id, expires_at=expires_at, controller=self.controller)
        return await self.forks.take(sandbox.id, lease)

    async def drop_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot image and its layer; idempotent."""
        await self.forks.drop(snapshot_id)

    async def list_owned(self) -> list[str]:
        """Live sandboxes, and destroyed ones whose removal the daemon has not confirmed."""
        return sorted(set(self._live) | self._unremoved)

    async def reap(self, older_than: float = 0.0) -> list[str]:
        """Remove orchard containers (anyone's, on this daemon) whose controller is dead,
        whose TTL passed ``older_than`` seconds ago, or that stopped and were not removed."""
        containers = await self.api.list_containers([names.OWNER])
        now = time.time()
        doomed = []
        for container in containers:  # entries of the list endpoint: Names, Labels, State
            name = container["Names"][0].lstrip("/")
            labels, state = container["Labels"] or {}, container["State"]
            alive = names.controller_alive(labels.get(names.CONTROLLER, ""))
            # exited or dead and never removed (e.g. the daemon restarted under it): of no use
            ended = state in ("exited", "dead")
            # an extended TTL is in its deadline file, not in its labels (which cannot change)
            extended_to = ttl_deadline(container["Mounts"] if "Mounts" in container else None)
            if name not in self._live and is_abandoned(
                labels, ended=ended, controller_alive=alive, now=now, older_than=older_than, extended_to=extended_to
            ):
                doomed.append(name)
        removed: list[str] = []

        async def remove(name: str) -> None:
            if await self._remove(name):
                removed.append(name)

        await concurrently(*(functools.partial(remove, name) for name in doomed))
        listed = {container["Names"][0].lstrip("/") for container in containers}
        await anyio.to_thread.run_sync(reap_ttl_dirs, self._hosts_dir or hosts_dir(), listed - set(removed))
        # after the containers: a fork keeps its snapshot image in use
        return sorted(removed) + await self.forks.reap(older_than)

    async def close(self) -> None:
        """Destroy every live sandbox, retry unconfirmed removals, close the connection."""
        with anyio.CancelScope(shield=True):
            closes = [sandbox.close for sandbox in self._live.values()]
            await concurrently(*closes, *(functools.partial(self._remove, name) for name in list(self._unremoved)))
            for snapshot_id in list(self.forks.taken):  # their forks are gone now
                await self.forks.drop(snapshot_id, quiet=True)
            await self._background.close()
            await self.api.close()
            if self._guardian is not None:
                await anyio.to_thread.run_sync(stop_guardian, self._guardian)
                self._guardian, self._guarded = None, False

    async def doctor(self) -> str:
        """One line for `orchard-async doctor`; raises AdapterUnavailable when no daemon answers."""
        line = await doctor(self.api, image=self.image, keepalive=self.keepalive)
        await self.api.client()  # whether the daemon shares this machine decides the switching
        refusal = self._network_refusal()
        switching = (
            f"set_network refused ({refusal})"
            if refusal
            else "set_network switches a container's egress (a veth pair to the host, an iptables allowlist "
            "in its namespace)" + forwarding_note()
        )
        return f"{line}; {switching}"

"""The docker adapter: one container per sandbox, driven over one long-lived exec.

A sandbox is a container whose main process is a self-destruct timer (``sleep`` under
Docker's init, created with AutoRemove). Commands never pay a ``docker exec`` each: at
creation one exec runs ``sh -s`` and its attach stream carries the shell-session
protocol (orchard_async.shell), the same code the local adapter speaks over pipes. File
operations are commands too, so they work on tmpfs mounts and read-only roots, where
the archive API does not.

Lifetimes, from the most to the least graceful end:

* ``destroy`` removes the container (force) and waits for the daemon to confirm.
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
processes), and the network is ``none`` unless the spec asks for it.

Every daemon call runs under a timeout. A daemon that stalls or dies surfaces as
``BackendUnavailable`` (creates; the pool backs off) or ``sandbox_lost`` results
(running sandboxes); both are infrastructure errors the rollout engine retries.

Connection: ``url=`` or ``DOCKER_HOST``, else what aiodocker finds (a docker context,
then the default sockets), as the docker CLI does. Podman's Docker API socket
(``DOCKER_HOST=unix:///run/podman/podman.sock``) speaks the same endpoints used here;
it was not available on the reference machine, so it is untested.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import time
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

import aiodocker
import aiohttp
import anyio
import anyio.abc
from aiodocker.containers import DockerContainer
from aiodocker.stream import Stream

from orchard_async.errors import AdapterUnavailable, BackendUnavailable, ConfigError, CreateFailed, SandboxLost
from orchard_async.images import ImageMissing, build_command, missing_image_hint
from orchard_async.lease import controller_alive, controller_id
from orchard_async.protocols import Sandbox
from orchard_async.sandbox import ShellSandbox
from orchard_async.shell import READY_TIMEOUT, CgroupShellClient, quote
from orchard_async.types import DEFAULT_OUTPUT_CAP, SandboxSpec

T = TypeVar("T")

DEFAULT_IMAGE = "orchard/busybox:test"
DEFAULT_WORKDIR = "/workspace"
CTL_DIR = "/tmp/.orchard"  # the shell protocol's scratch files; a tmpfs on read-only roots
OUT_DIR = f"{CTL_DIR}/out"  # the output FIFOs the relays copy to the controller
WHERE = "the Docker daemon"

API_TIMEOUT = 30.0  # any single daemon call
PULL_TIMEOUT = 600.0
INTERRUPT_TIMEOUT = 5.0  # signalling a timed-out command
DESTROY_TIMEOUT = 20.0
SEND_TIMEOUT = 30.0  # writing one frame into the exec stream, plus time for its size
SEND_RATE = 1e6  # bytes per second assumed for big frames (file writes)
SETUP_FAILED = "@@ORCHARD-SETUP-FAILED"  # the exec's stderr when the preamble failed
STDERR_KEPT = 4096  # bytes of the exec's own stderr kept to explain a shell that did not start

# Processes the adapter itself runs in every container, added to spec.pids so that the
# limit counts what commands may start: init, the timer and its sleep, the exec wrapper
# with its two sides and cat, the keepalive watchdog and its sleep (where the image's
# shell has no `read -t`), the two output relays, the shell, and the command's subshell.
PIDS_OVERHEAD = 13
KEEPALIVE = 6.0  # seconds without a byte from the controller before a container ends itself
KEEPALIVE_CHECKS = 4  # the watchdog looks this many times per keepalive period

# The container's main process (under docker-init): the self-destruct timer, in sh.
#
# * A controller killed between starting a container and attaching its shell leaves a
#   container no shell will ever end, so the timer first waits the attach grace ($1) and
#   goes on to the rest of the TTL ($2) only if a shell has attached: the shell writes
#   its pid to SHELL_PID ($3) as it starts.
# * It relays SIGUSR1 to the shell: the client's timeout interrupt. Docker can signal a
#   container (its init forwards the signal to the timer) but not an exec, and a second
#   exec to run `kill` would need a free pid, which a command that hit the pids limit
#   has taken. `read` and `kill` are builtins: relaying forks nothing.
# * It sleeps in the background: a shell runs traps only between commands, and `wait`
#   returns at once for a trapped signal.
SHELL_PID = f"{CTL_DIR}/shell.pid"
ATTACH_GRACE = 60.0  # well beyond the seconds an attach takes on a loaded daemon
TIMER = """
_o_pid=$3
_o_relay() { if read -r _o_p <"$_o_pid"; then kill -USR1 "$_o_p"; fi; }
trap _o_relay USR1
_o_nap() { sleep "$1" & _o_s=$!; while kill -0 "$_o_s" 2>/dev/null; do wait "$_o_s"; done; }
_o_nap "$1"
if [ -e "$_o_pid" ]; then _o_nap "$2"; fi
"""

# The exec's command: the protocol shell, wrapped so that the container ends with it.
# `cat` relays stdin and notices EOF (the controller closed the stream or died, even by
# SIGKILL) at once, even while a command runs and the shell is not reading; and if the
# shell itself dies, its side notices. Either side then kills every process but init
# (`kill -1`), the timer among them, and init exits with it. Signalling init does not
# work: the kernel drops signals sent to a namespace's init from inside unless it has a
# handler, and docker-init waits for signals with them blocked instead.
#
# EOF alone is not enough: it needs the daemon to close the exec's stdin when the client's
# connection goes, and a controller can also stop without closing anything (frozen,
# stalled). So the wrapper also runs a watchdog (WATCHDOG) over the relay: the controller
# sends a byte on an idle stream every second, and when the relay's read count (rchar in
# /proc/<cat>/io) has not moved for $1 milliseconds, the watchdog kills every process the
# same way. $1 = 0 turns it off. The watchdog's output goes nowhere: the shell's pipe has
# one writer, the relay. While a command runs the shell reads nothing, so heartbeats wait
# in that pipe (64 KiB: one command may run about 18 hours before a full pipe stalls the
# relay and the watchdog takes the silence for a dead controller; TTLs are far shorter).
SHELL_WRAPPER = """
{ exec 3<&0 </dev/null
  cat <&3 3<&- & _o_c=$!
  exec 3<&-
  if [ "$1" != 0 ]; then
    _o_sh=sh; if command -v bash >/dev/null 2>&1; then _o_sh=bash; fi
    : | "$_o_sh" -c "$3" orchard-keepalive "$_o_c" "$1" "$2" >/dev/null 2>&1 &
  fi
  wait "$_o_c"; kill -KILL -1
} | { sh -s; kill -KILL -1; }
"""

# The keepalive watchdog: $1 the relay's pid, $2 the keepalive in milliseconds, $3 checks per
# keepalive. It waits with `read -t` on a pipe nobody writes to (its stdin, reopened
# read-write so it never sees EOF): no process per tick, so it keeps working when the
# command has taken every pid. bash and busybox sh have `read -t`; with a shell that has
# not (dash without bash), it forks `sleep`, and dies if a full pids limit refuses the
# fork (the EOF path and the TTL still hold).
WATCHDOG = """
_o_c=$1; _o_checks=$3; _o_ms=$(($2 / $3))
_o_every=$((_o_ms / 1000)).$((_o_ms % 1000 / 100))$((_o_ms % 100 / 10))$((_o_ms % 10))
exec 4<>/proc/self/fd/0 0</dev/null
read -t 0.01 _o_x <&4 2>/dev/null
if [ $? = 2 ]; then _o_tick() { sleep "$_o_every"; }; else _o_tick() { read -t "$_o_every" _o_x <&4; }; fi
_o_last=; _o_quiet=0
while [ "$_o_quiet" -lt "$_o_checks" ]; do
  _o_tick
  read -r _o_k _o_n <"/proc/$_o_c/io" || exit 0
  if [ "$_o_n" = "$_o_last" ]; then _o_quiet=$((_o_quiet + 1)); else _o_quiet=0; _o_last=$_o_n; fi
done
kill -KILL -1
"""
SHELL_ONLY = ["sh", "-s"]

# Command output never lands on the container's disk (a command printing 2 GB must not fill
# it): the server points a command's stdout and stderr at two FIFOs, and one exec per FIFO
# relays it to the controller (the shell protocol's relay mode, orchard_async.shell), which
# keeps the head and tail and counts the rest. Each relay makes its FIFO, says it is ready,
# and becomes `cat` holding the FIFO open read-write (so it never reads an end between
# commands). It is read only while a command runs: between commands the daemon's socket
# fills, the FIFO behind it fills, and a background writer blocks, using no memory here.
# `$1` the FIFO's directory, `$2` its name.
RELAY = (
    'mkdir -p "$1" && { [ -p "$1/$2" ] || mkfifo -m 600 "$1/$2"; } && printf "@@RELAY %s\\n" "$2" && exec cat <>"$1/$2"'
)


def shell_command(keepalive: float) -> list[str]:
    """The exec's argv: the wrapped shell, with the watchdog after ``keepalive`` seconds
    (whole milliseconds; 0 turns it off)."""
    return ["sh", "-c", SHELL_WRAPPER, "orchard-shell", str(round(keepalive * 1000)), str(KEEPALIVE_CHECKS), WATCHDOG]


# -- the hot path: an exec attach stream as an anyio byte stream -----------------------------


class ExecStream(anyio.abc.ByteStream):
    """stdin/stdout of one ``docker exec`` as an anyio ByteStream, for ShellClient.

    A reader task drains the attach stream into an unbounded buffer as soon as bytes
    arrive: aiodocker pauses the socket when its 64 KiB queue is full, and a client busy
    writing a large frame while the shell writes output would otherwise deadlock. The
    buffer stays small because the client reads every frame to its end. The exec's
    stderr is not part of the protocol; its tail is kept to explain a failed start.
    """

    def __init__(self, stream: Stream):
        self._stream = stream
        self._send, self._receive = anyio.create_memory_object_stream[bytes](max_buffer_size=math.inf)
        self._pending = b""
        self.stderr_tail = b""
        self.last_sent = time.monotonic()  # for the keepalive: idle streams get a heartbeat
        self._reader = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        try:
            while (message := await self._stream.read_out()) is not None:
                if message.stream == 1:
                    self._send.send_nowait(message.data)
                else:
                    self.stderr_tail = (self.stderr_tail + message.data)[-STDERR_KEPT:]
        except Exception:  # noqa: BLE001 - any failure of the connection is the end of the stream
            pass
        finally:
            self._send.close()  # the client's next receive sees EndOfStream

    async def ended(self) -> None:
        """Until the exec's output has ended (its shell exited, or the connection broke)."""
        await asyncio.wait({self._reader})  # never raises; cancelling it leaves the reader alone

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._pending:
            self._pending = await self._receive.receive()
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def send(self, item: bytes) -> None:
        # aiodocker's write has no timeout (a stalled daemon blocks the drain forever) and
        # fails with AssertionError or RuntimeError once the connection is gone.
        self.last_sent = time.monotonic()
        try:
            with anyio.fail_after(SEND_TIMEOUT + len(item) / SEND_RATE):
                await self._stream.write_in(item)
        except (TimeoutError, AssertionError, RuntimeError, OSError, aiohttp.ClientError) as exc:
            raise anyio.BrokenResourceError(f"the exec stream is gone ({type(exc).__name__})") from exc

    async def beat(self, limit: float) -> None:
        """The keepalive's heartbeat: a newline, which the shell reads as an empty command.
        It never lands inside a frame: each frame is one transport write, and so is this.
        Waiting for the drain is bounded: the byte is in the transport's buffer already, and
        one slow stream must not hold back the others' heartbeats."""
        self.last_sent = time.monotonic()
        with anyio.move_on_after(limit), contextlib.suppress(Exception):
            await self._stream.write_in(b"\n")

    async def send_eof(self) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(Exception):
            await self._stream.close()
        self._receive.close()


class RelayStream(anyio.abc.ByteReceiveStream):
    """The stdout of one output relay exec (see RELAY), read on demand: unread, it applies
    backpressure all the way to the command writing the FIFO. Any failure of the
    connection is the end of the stream."""

    def __init__(self, stream: Stream):
        self._stream = stream
        self._pending = b""
        self.stderr_tail = b""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._pending:
            try:
                message = await self._stream.read_out()
            except Exception as exc:  # noqa: BLE001 - a broken connection ends the relay
                raise anyio.BrokenResourceError(f"the output relay is gone ({type(exc).__name__})") from exc
            if message is None:
                raise anyio.EndOfStream
            if message.stream == 1:
                self._pending = message.data
            else:
                self.stderr_tail = (self.stderr_tail + message.data)[-STDERR_KEPT:]
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def ready(self, name: str) -> None:
        """Wait for the relay's ready line; what follows it stays for the shell client."""
        line = f"@@RELAY {name}\n".encode()
        received = b""
        while not received.startswith(line):
            if len(received) >= len(line):
                raise anyio.BrokenResourceError(f"the output relay said {received[:80]!r}")
            received += await self.receive()
        self._pending = received[len(line) :] + self._pending

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._stream.close()


class AttachStream(RelayStream, anyio.abc.ByteStream):
    """stdin and stdout of one exec (``open_stream``), both on demand: unread output holds
    the process back (the daemon's socket fills), as a pipe would."""

    async def send(self, item: bytes) -> None:
        try:
            with anyio.fail_after(SEND_TIMEOUT + len(item) / SEND_RATE):
                await self._stream.write_in(item)
        except (TimeoutError, AssertionError, RuntimeError, OSError, aiohttp.ClientError) as exc:
            raise anyio.BrokenResourceError(f"the exec stream is gone ({type(exc).__name__})") from exc

    async def send_eof(self) -> None:
        """Half-close the connection: the daemon closes the process's stdin (as ``docker
        exec -i`` does at the end of its input). aiodocker has no call for it, so this
        reaches its connection's transport."""
        response = getattr(self._stream, "_resp", None)
        transport = response.connection.transport if response is not None and response.connection else None
        if transport is None or not transport.can_write_eof():
            raise anyio.BrokenResourceError("the exec stream is gone")
        transport.write_eof()


# -- the adapter ----------------------------------------------------------------------------


class DockerAdapter:
    """Sandboxes as Docker containers. Options (``--adapter-options`` JSON in the CLI):

    image          default image when a spec names none
    url            daemon address (else DOCKER_HOST, else docker context or default socket)
    run_id, owner  lease labels (default: a fresh run id; user@host)
    max_creating   containers being created at once (the daemon serialises most of it)
    api_timeout    seconds any single daemon call may take
    read_only      read-only root file system; the workdir and the control dir get tmpfs mounts
    tmpfs          {path: mount options} extra tmpfs mounts (executable unless 'noexec')
    exit_with_shell  end the container when its shell ends (default); False keeps it until
                   its TTL (tests of the TTL and reap paths use this)
    keepalive      seconds without a byte from this controller after which a container ends
                   itself (default 6; 0 turns it off); needs exit_with_shell
    attach_grace   seconds a started container waits for its shell before ending itself
    output_cap     bytes kept per output stream
    """

    name = "docker"

    def __init__(
        self,
        *,
        image: str = DEFAULT_IMAGE,
        url: str | None = None,
        run_id: str | None = None,
        owner: str | None = None,
        max_creating: int = 8,
        api_timeout: float = API_TIMEOUT,
        read_only: bool = False,
        tmpfs: dict[str, str] | None = None,
        exit_with_shell: bool = True,
        attach_grace: float = ATTACH_GRACE,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        keepalive: float = KEEPALIVE,
    ):
        if max_creating < 1:
            raise ConfigError(f"max_creating must be at least 1, got {max_creating}")
        if not (isinstance(keepalive, int | float) and not isinstance(keepalive, bool) and 0 <= keepalive < math.inf):
            raise ConfigError(f"keepalive must be a number of seconds (0 turns it off), got {keepalive!r}")
        if 0 < keepalive < 1:
            raise ConfigError(f"keepalive must be at least 1 second (heartbeats go out every second), got {keepalive}")
        self.image = image
        self.url = url or os.environ.get("DOCKER_HOST") or None
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.owner = owner or f"{os.environ.get('USER', 'user')}@{socket.gethostname()}"
        self.max_creating = max_creating
        self.api_timeout = api_timeout
        self.read_only = read_only
        self.tmpfs = dict(tmpfs or {})
        self.exit_with_shell = exit_with_shell
        self.attach_grace = attach_grace
        self.output_cap = output_cap
        self.keepalive = float(keepalive) if exit_with_shell else 0.0
        self.controller = controller_id()
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
        self._streams: dict[str, ExecStream] = {}  # the heartbeat's round
        self._relays: dict[str, list[RelayStream]] = {}  # each sandbox's output relays, closed with it
        self._heartbeat: asyncio.Task[None] | None = None
        self._unremoved: set[str] = set()  # destroyed, but the daemon did not confirm removal

    # -- daemon access ------------------------------------------------------------------------

    async def _client(self) -> aiodocker.Docker:
        if self._docker is None:
            # Concurrent first calls must share one client: connecting awaits.
            self._connecting = self._connecting or anyio.Lock()
            async with self._connecting:
                if self._docker is None:
                    self._create_gate = anyio.Semaphore(self.max_creating)
                    self._docker = await self._connect()
        return self._docker

    async def _connect(self) -> aiodocker.Docker:
        """aiodocker's client, with an unbounded connection pool on unix sockets: each live
        sandbox holds one connection (its exec stream), and aiohttp's default pool of 100
        would make the 101st sandbox wait forever."""
        timeout = aiohttp.ClientTimeout(sock_connect=10)
        docker = aiodocker.Docker(url=self.url, timeout=timeout)
        if not isinstance(docker.connector, aiohttp.UnixConnector):
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
                f"the Docker daemon at {self._endpoint} did not answer {what} within {limit:.0f}s"
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
        image = spec.image or self.image
        async with self._create_gate:  # admission control: the daemon serialises creates
            await self._ensure_image(docker, image, spec.pull)
            name = f"orchard-{uuid.uuid4().hex[:16]}"
            expires_at = time.time() + spec.ttl
            labels = self._labels(spec, expires_at)
            container = await self._start_container(docker, name, self._container_config(spec, image, labels))
            try:
                client = await self._open_shell(container, spec, name)
            except BaseException:
                self._streams.pop(name, None)
                await self._remove(name)
                await self._close_relays(name)
                raise

        async def teardown() -> None:
            self._live.pop(name, None)
            self._streams.pop(name, None)
            # Remove first: closing the stream first would make the container end itself
            # (exit_with_shell) and race our removal with AutoRemove's.
            await self._remove(name)
            await client.aclose()
            await self._close_relays(name)

        sandbox = ShellSandbox(
            id=name,
            client=client,
            root="/",
            labels=labels,
            on_close=teardown,
            expires_at=expires_at,
            stream_opener=lambda sandbox, command: self._open_stream(container, sandbox, command),
        )
        self._live[name] = sandbox
        return sandbox

    def _labels(self, spec: SandboxSpec, expires_at: float) -> dict[str, str]:
        return {
            **spec.labels,
            "orchard.owner": self.owner,
            "orchard.run": self.run_id,
            "orchard.expires": str(int(expires_at)),
            "orchard.controller": self.controller,
        }

    def _workdir(self, spec: SandboxSpec) -> str:
        return spec.workdir or DEFAULT_WORKDIR

    def _container_config(self, spec: SandboxSpec, image: str, labels: dict[str, str]) -> dict[str, Any]:
        host: dict[str, Any] = {
            "AutoRemove": True,  # the timer's end is the container's end
            "Init": True,  # reaps zombies of commands; forwards the end signal to the timer
            "NetworkMode": "bridge" if spec.network == "on" else "none",
            "PidsLimit": (spec.pids + PIDS_OVERHEAD) if spec.pids else None,
            "ReadonlyRootfs": self.read_only,
            "Tmpfs": self._tmpfs_mounts(spec),
            "LogConfig": {"Type": "none", "Config": {}},  # the timer prints nothing
            "CapDrop": ["ALL"],  # the shell server needs none (see the module docstring)
            "SecurityOpt": ["no-new-privileges"],
        }
        if spec.cpu:
            host["NanoCpus"] = int(spec.cpu * 1e9)
        if spec.memory_bytes:
            # Swap as large as memory means no swap: over the limit, the OOM killer acts.
            host["Memory"] = host["MemorySwap"] = spec.memory_bytes
        return {
            "Image": image,
            "Entrypoint": ["sh", "-c", TIMER, "orchard-timer"],
            "Cmd": _timer_args(spec.ttl, self.attach_grace),
            "Env": [f"{key}={value}" for key, value in spec.env.items()],
            "Labels": labels,
            "HostConfig": {key: value for key, value in host.items() if value is not None},
        }

    def _tmpfs_mounts(self, spec: SandboxSpec) -> dict[str, str]:
        """Docker mounts tmpfs noexec by default; sandboxes run what they write, so add exec.
        A read-only root gets tmpfs for the two places the sandbox must write."""
        mounts = dict(self.tmpfs)
        if self.read_only:
            mounts.setdefault(self._workdir(spec), "")
            mounts.setdefault(CTL_DIR, "mode=0700")
        return {path: _with_exec(options) for path, options in mounts.items()}

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

    async def _start_container(self, docker: aiodocker.Docker, name: str, config: dict[str, Any]) -> DockerContainer:
        try:
            container = await self._call("container create", docker.containers.create(config, name=name))
            await self._call("container start", container.start())
        except BaseException as exc:
            # Even a create that failed may have made the container (its answer was lost).
            await self._remove(name)
            if isinstance(exc, aiodocker.DockerError):
                raise self._create_error(config["Image"], exc) from None
            raise
        return container

    @staticmethod
    def _create_error(image: str, exc: aiodocker.DockerError) -> Exception:
        """The daemon refuses a bad request (an image vanished, a limit it cannot apply) with
        4xx: retrying cannot help, so it is the caller's to fix. 5xx may pass: retry."""
        if exc.status == 404:
            return ImageMissing(
                f"image {image} is not on {WHERE} ({exc.message.strip()}); {missing_image_hint(image, WHERE)}"
            )
        if 400 <= exc.status < 500:
            return ConfigError(f"the Docker daemon refused the sandbox spec: {exc.message}")
        return CreateFailed(f"the Docker daemon failed to create the container: {exc.message}")

    async def _attach(self, container: DockerContainer, command: list[str], what: str, *, stdin: bool) -> Stream:
        """Create and start an exec, attached (stdout and stderr; stdin when asked)."""
        try:
            execution = await self._call(
                f"{what} exec create", container.exec(command, stdin=stdin, stdout=True, stderr=True, tty=False)
            )
            attach = execution.start(detach=False)
            await self._call(f"{what} exec start", attach.__aenter__())  # upgrades the HTTP connection
        except aiodocker.DockerError as exc:
            raise CreateFailed(f"could not start the sandbox {what}: {exc.message}") from None
        return attach

    async def _open_relays(self, container: DockerContainer, name: str) -> tuple[RelayStream, RelayStream]:
        """The two output relays (stdout, stderr; see RELAY), started at once, each ready."""
        relays: dict[str, RelayStream] = {}
        errors: list[Exception] = []

        async def open_relay(fifo: str) -> None:
            command = ["sh", "-c", RELAY, "orchard-relay", OUT_DIR, fifo]
            try:
                relay = RelayStream(await self._attach(container, command, "output relay", stdin=False))
            except (CreateFailed, BackendUnavailable) as exc:
                errors.append(exc)
                return
            relays[fifo] = relay
            self._relays.setdefault(name, []).append(relay)
            try:
                with anyio.fail_after(READY_TIMEOUT):
                    await relay.ready(fifo)
            except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
                why = relay.stderr_tail.decode(errors="replace").strip()
                if why:  # it could not make its FIFO: the image's doing, not the daemon's
                    errors.append(
                        ConfigError(
                            f"the sandbox could not create its output FIFO in {OUT_DIR}: {why}; "
                            "the image's user must be able to write /tmp (read_only=True mounts a tmpfs there)"
                        )
                    )
                else:
                    errors.append(CreateFailed(f"the sandbox's output relay did not start ({type(exc).__name__})"))

        # errors are collected, not raised, so that they do not come out of the task group
        # wrapped in an exception group
        async with anyio.create_task_group() as group:
            for fifo in ("o", "e"):
                group.start_soon(open_relay, fifo)
        if errors:
            raise errors[0]
        return relays["o"], relays["e"]

    async def _close_relays(self, name: str) -> None:
        with anyio.CancelScope(shield=True):
            for relay in self._relays.pop(name, []):
                await relay.aclose()

    async def _open_shell(self, container: DockerContainer, spec: SandboxSpec, name: str) -> CgroupShellClient:
        """Start the long-lived shell exec, its output relays, and the shell-session server."""
        command = shell_command(self.keepalive) if self.exit_with_shell else SHELL_ONLY
        stream = ExecStream(await self._attach(container, command, "shell", stdin=True))
        if self.keepalive:  # from the first byte: the watchdog is already counting
            self._streams[name] = stream
            self._start_heartbeat()
        workdir = self._workdir(spec)
        try:
            await stream.send(self._preamble(workdir).encode())
            try:
                relays = await self._open_relays(container, name)
            except (ConfigError, CreateFailed):
                # A shell whose preamble failed ends the container, relays and all: its
                # reason is the one to give.
                with anyio.move_on_after(5):
                    await stream.ended()
                if SETUP_FAILED not in stream.stderr_tail.decode(errors="replace"):
                    raise
                raise SandboxLost("the sandbox shell did not start") from None
            client = CgroupShellClient(
                stream,
                workdir=workdir,
                interrupt=lambda _client: self._interrupt(container),
                output_cap=self.output_cap,
                output_pipes=OUT_DIR,
                output_relays=relays,
            )
            await client.start(CTL_DIR)
        except (SandboxLost, anyio.BrokenResourceError) as exc:
            await stream.aclose()
            why = stream.stderr_tail.decode(errors="replace")
            if SETUP_FAILED in why:  # the image, not the daemon: retrying cannot help
                raise ConfigError(
                    f"the sandbox could not create {workdir} and {CTL_DIR}: {why.replace(SETUP_FAILED, '').strip()}; "
                    "choose a workdir the image's user can write (read_only=True mounts a tmpfs there)"
                ) from None
            raise CreateFailed(f"the sandbox shell did not start: {why.strip() or exc}") from None
        except BaseException:
            await stream.aclose()
            raise
        return client

    async def _open_stream(self, container: DockerContainer, sandbox: Sandbox, command: list[str]) -> AttachStream:
        """One exec with stdin attached: ``open_stream``'s transport."""
        try:
            return AttachStream(await self._attach(container, command, "stream", stdin=True))
        except CreateFailed as exc:  # the container is gone, or the daemon refused the exec
            raise SandboxLost(f"no stream into {sandbox.id}: {exc}") from None

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat_idle_streams())

    async def _beat_idle_streams(self) -> None:
        """One task per adapter: every second, a heartbeat on each stream that sent nothing
        for a second (a busy stream needs none). It ends when no stream is left."""
        interval = min(1.0, self.keepalive / 6)
        while self._streams:
            await asyncio.sleep(interval)
            due = time.monotonic() - interval
            idle = [stream for stream in self._streams.values() if stream.last_sent <= due]
            if idle:
                await asyncio.gather(*(stream.beat(interval) for stream in idle), return_exceptions=True)

    @staticmethod
    def _preamble(workdir: str) -> str:
        """What the exec's shell runs before the server script (it becomes the server): the
        directories it and the commands need, and its pid for the timer (see TIMER)."""
        dirs = f"{quote(CTL_DIR)} {quote(workdir)}"
        return f"mkdir -p -- {dirs} && echo $$ >{quote(SHELL_PID)} || {{ echo {SETUP_FAILED} >&2; exit 1; }}\n"

    async def _interrupt(self, container: DockerContainer) -> None:
        """Deliver the client's timeout interrupt: SIGUSR1 to the container, which its
        timer relays to the shell (see TIMER). If the daemon cannot do it in time, the
        client's grace period declares the sandbox lost."""
        with contextlib.suppress(BackendUnavailable, aiodocker.DockerError):
            await self._call("interrupt", container.kill(signal="SIGUSR1"), INTERRUPT_TIMEOUT)

    # -- destroy, reap, close -----------------------------------------------------------------

    async def destroy(self, sandbox: Sandbox) -> None:
        await sandbox.close()

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

    async def list_owned(self) -> list[str]:
        """Live sandboxes, and destroyed ones whose removal the daemon has not confirmed."""
        return sorted(set(self._live) | self._unremoved)

    async def reap(self, older_than: float = 0.0) -> list[str]:
        """Remove orchard containers (anyone's, on this daemon) whose controller is dead,
        whose TTL passed ``older_than`` seconds ago, or that stopped and were not removed."""
        docker = await self._client()
        filters = '{"label": ["orchard.owner"]}'
        containers = await self._call("container list", docker.containers.list(all=True, filters=filters))
        now = time.time()
        doomed = []
        for container in containers:  # entries of the list endpoint: Names, Labels, State
            name = container["Names"][0].lstrip("/")
            labels, state = container["Labels"] or {}, container["State"]
            if name not in self._live and _is_abandoned(labels, state, now, older_than):
                doomed.append(name)
        removed: list[str] = []

        async def remove(name: str) -> None:
            if await self._remove(name):
                removed.append(name)

        async with anyio.create_task_group() as group:
            for name in doomed:
                group.start_soon(remove, name)
        return sorted(removed)

    async def close(self) -> None:
        """Destroy every live sandbox, retry unconfirmed removals, close the connection."""
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as group:
                for sandbox in list(self._live.values()):
                    group.start_soon(sandbox.close)
                for name in list(self._unremoved):
                    group.start_soon(self._remove, name)
            if self._heartbeat is not None:
                self._heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._heartbeat
                self._heartbeat = None
            if self._docker is not None:
                await self._disconnect(self._docker)
                self._docker = None

    async def doctor(self) -> str:
        """One line for `orchard-async doctor`; raises AdapterUnavailable when no daemon answers."""
        docker = await self._connect()
        try:
            version = await self._call("version", docker.version(), 10)
            present = await self._image_present(docker, self.image)
        except (BackendUnavailable, CreateFailed) as exc:
            raise AdapterUnavailable(str(exc)) from None
        finally:
            await self._disconnect(docker)
        image = "present" if present else f"MISSING ({missing_image_hint(self.image, WHERE)})"
        keepalive = f"ends {self.keepalive:g} s after its controller goes silent" if self.keepalive else "no keepalive"
        return (
            f"Docker {version.get('Version', '?')} (API {version.get('ApiVersion', '?')}) at {self._endpoint}; "
            f"default image {self.image} {image}; each sandbox: all capabilities dropped, no-new-privileges, "
            f"pids limit from spec.pids, no network unless spec.network='on', {keepalive}"
        )


def _timer_args(ttl: float, attach_grace: float) -> list[str]:
    """TIMER's arguments: the attach grace, the rest of the TTL, the shell's pid file."""
    total = math.ceil(ttl)
    grace = min(total, math.ceil(attach_grace))
    return [str(grace), str(total - grace), SHELL_PID]


def _with_exec(options: str) -> str:
    words = [word for word in options.split(",") if word]
    if "noexec" not in words and "exec" not in words:
        words.append("exec")
    return ",".join(words)


def _is_abandoned(labels: dict[str, str], state: str, now: float, older_than: float) -> bool:
    if state in ("exited", "dead"):
        return True  # never removed (e.g. the daemon restarted under it): of no use to anyone
    try:
        expires = float(labels.get("orchard.expires", "0"))
    except ValueError:
        expires = 0.0
    if expires + older_than < now:
        return True
    return controller_alive(labels.get("orchard.controller", "")) is False

"""The local adapter: sandboxes as processes on this machine, the embedded default.

Each sandbox is a private directory ``<root>/<id>/`` (``work/`` for the agent, seen inside
at ``/workspace`` as in a container, ``dirs/`` behind ``spec.writable_dirs``, ``ctl/`` for
the shell protocol's scratch files, ``out/`` for the FIFOs the controller reads a command's
output from, ``bin/`` for ``python``, ``lease.json`` for reap) and one persistent ``sh``
speaking the shell-session protocol over pipes.

On Linux a sandbox is a boundary (see ``local_isolation``): its own user, PID, mount, IPC,
UTS and network namespaces, the host read-only, its home and the other sandboxes out of
sight, no capabilities, an unprivileged user, a clean environment. ``isolation="auto"``
takes bubblewrap, else ``unshare``; where neither works, a sandbox without network
(``network="none"``, the default) is refused unless the caller asked for
``isolation="none"`` by name.

Lifetime: a launcher shell on the host starts the sandbox and, when it ends, removes its
directory and cgroup. Inside, a small supervisor shell (see ``SUPERVISOR``) runs the
shell-session server as its child, kills that server when the TTL passes, and when the
server ends, for whatever reason, kills everything left in the sandbox. So a SIGKILLed
controller leaves nothing behind: the server sees EOF on its pipe and ends, and the TTL ends
it regardless. ``reap`` finds leftovers by lease file and by the ``ORCHARD_SANDBOX`` variable
(the sandbox's directory) every process of a sandbox inherits.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import BinaryIO

import anyio
from anyio.streams.stapled import StapledByteStream

from orchard_async.adapters import local_isolation as iso
from orchard_async.adapters import local_snapshot as snaps
from orchard_async.adapters.local_reap import (
    SANDBOX_ENV,
    NamespaceInit,
    Sweeper,
    _kill_quietly,
    _sandbox_processes,
    reap_local,
)
from orchard_async.capabilities import AdapterFacts, Doctor, Facts, Snapshots, spec_network
from orchard_async.errors import ConfigError, CreateFailed, SandboxLost
from orchard_async.kit import egress, procfs
from orchard_async.kit import labels as names
from orchard_async.kit.egress import NamespaceEgress, NetworkSwitch
from orchard_async.kit.sandbox import ShellSandbox
from orchard_async.kit.shell import ShellClient, make_output_pipes, quote
from orchard_async.kit.streams import PipeStream
from orchard_async.protocols import TIMER_NAME, Sandbox
from orchard_async.types import DEFAULT_OUTPUT_CAP, SandboxSpec

__all__ = ["SANDBOX_ENV", "LocalAdapter", "_sandbox_processes", "default_root", "isolation_report", "reap_local"]

DESTROY_GRACE = 5.0
CREATE_ATTEMPTS = 2  # a sandbox shell that does not start is started again once
STREAM_START_TIMEOUT = 30.0  # starting a stream's process, until it holds its FIFOs
# A snapshot outlives the sandbox it was taken from (a group's samples start from it later);
# reap removes it at once when its controller is dead, else past this lifetime.
SNAPSHOT_TTL = 24 * 3600.0
# An extendable sandbox's deadline (epoch seconds) in its dir, which the sandbox sees read-only.
DEADLINE_FILE = "deadline"

# `$1` TTL seconds, `$2` "ns" when the sandbox has its own PID namespace; for a sandbox whose
# TTL may be extended, `$3` the deadline file (epoch seconds, written by the controller on the
# host: the sandbox sees its directory read-only) and `$4` the hard cap (epoch seconds: the
# TTL plus spec.max_extension), past which no deadline holds. stdin is the controller's pipe,
# passed to the server. Traps run while the supervisor waits (POSIX `wait` returns on a
# trapped signal), which a shell blocked reading commands does not do: that is why the TTL
# lives here, not in the server. The timer ignores the signals it can (the sandbox's commands
# could send them), and re-checks the clock after every sleep, so a sleep cut short sleeps
# again to the deadline (a command may kill any process it sees: that must not end the
# sandbox early); a deadline that is not a number ends it.
SUPERVISOR = r"""
exec 3<&0 0</dev/null
sh -s <&3 3<&- &
server=$!
exec 3<&-
trap 'kill -USR1 $server 2>/dev/null' USR1
(trap '' HUP INT QUIT TERM USR1 USR2 ALRM PIPE
 n=$(date +%s); end=$((n + $1))
 while [ "$n" -lt "$end" ]; do sleep $((end - n)); n=$(date +%s) || break; done
 if [ -n "$3" ]; then
   while read -r d <"$3" && n=$(date +%s) && [ "$d" -gt "$n" ]; do
     if [ "$d" -gt "$4" ]; then d=$4; fi
     if [ "$d" -le "$n" ]; then break; fi
     sleep $((d - n))
   done
 fi
 kill -KILL $server) </dev/null >/dev/null 2>&1 &
while :; do wait $server; kill -0 $server 2>/dev/null || break; done
if [ "$2" = ns ]; then kill -KILL -1 2>/dev/null; fi
"""


# Signals a child gets back at their default by subprocess itself (restore_signals).
RESTORED_BY_SUBPROCESS = frozenset(
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name)
)
# Runs a command with every signal at its default: where the host's `env` lacks
# --default-signal (coreutils before 8.31).
RESET_SIGNALS = (
    "import os, signal, sys\n"
    "for s in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:\n"
    "    try: signal.signal(s, signal.SIG_DFL)\n"
    "    except (OSError, ValueError): pass\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def inherited_ignores() -> list[str]:
    """Signals this process ignores that a child would inherit ignored: nohup's SIGHUP, a
    background job's SIGINT and SIGQUIT. (A signal a shell ignores on entry is one it cannot
    trap or reset, so a sandbox's shell would hand them on to every command.)"""
    ignored = []
    for sig in signal.valid_signals() - RESTORED_BY_SUBPROCESS:
        with contextlib.suppress(OSError, ValueError):
            if signal.getsignal(sig) == signal.SIG_IGN:
                ignored.append(signal.Signals(sig).name)
    return sorted(ignored)


@functools.cache
def _env_resets_signals() -> bool:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(["env", "--default-signal=HUP", "true"], capture_output=True, timeout=10)
        return done.returncode == 0
    return False


def default_signals_argv() -> list[str]:
    """The prefix that starts a sandbox with default signal dispositions, whatever this
    process inherited (nothing when it ignores none)."""
    ignored = inherited_ignores()
    if not ignored:
        return []
    if _env_resets_signals():
        return ["env", "--default-signal=" + ",".join(name.removeprefix("SIG") for name in ignored)]
    return [sys.executable, "-S", "-c", RESET_SIGNALS]


# What the controller starts first, before the sandbox's directory exists: it waits for the
# controller's `go <cgroup or ->` line on the pipe (`read` takes bytes up to the newline
# only: the rest is the server's), then sends its stderr to the sandbox's log and becomes the
# launcher in the work dir. At EOF instead (the controller died, or gave up, while it made
# the directory) it removes the directory (unmounting a fork's overlay first), so a SIGKILL at
# any point of a create leaves nothing. `$1` the sandbox dir, `$2` the launcher's script, then
# the launcher's arguments after its dir and cgroup.
GATE = r"""
_o_base=$1 _o_launcher=$2; shift 2
if IFS=' ' read -r _o_go _o_cg && [ "$_o_go" = go ]; then
  exec 2>>"$_o_base/ctl/shell.log"
  cd -- "$_o_base/work" || exit 1
  [ "$_o_cg" != - ] || _o_cg=
  exec sh -c "$_o_launcher" launcher "$_o_base" "$_o_cg" "$@"
fi
if [ -d "$_o_base/upper" ]; then umount -l -- "$_o_base/work" 2>/dev/null; fi
rm -rf -- "$_o_base" 2>/dev/null
exit 1
"""


def default_root() -> Path:
    return Path(os.environ.get("ORCHARD_LOCAL_ROOT") or Path(tempfile.gettempdir()) / "orchard-async")


def isolation_report(isolation: str = "auto") -> dict[str, str]:
    """What the local adapter enforces on this machine, for `orchard-async doctor`. Each line
    is held to by a test: tests/adapters/test_local_isolation.py (one per line), with
    tests/conformance/test_attacks.py, tests/adapters/test_local.py and, for a non-root
    caller, tests/adapters/test_local_unprivileged.py."""
    try:
        mode, found = iso.resolve(isolation)
    except ConfigError as exc:
        return {"isolation": f"NONE: {exc}"}
    executable, pytest_version = iso.interpreter()
    report = {"interpreter": f"{executable} as python and python3 (pytest {pytest_version})"}
    if mode == "none":
        report.update(
            {
                "isolation": f"NONE ({found.why}): sandboxes without network are refused unless "
                "isolation='none' is asked for, which runs commands as you, on your files, with your network",
                "filesystem": f"yours, as you: no {iso.WORKSPACE} (the work dir is a dir of the host, the default "
                "cwd) and no spec.writable_dirs (refused) without a mount namespace",
                "output": "not spooled to disk: read from pipes, capped at the output cap",
                "pids": "not enforced (RLIMIT_NPROC would count every process of your user, not the sandbox's)",
                "memory": "RLIMIT_AS (address space, per process) from spec.memory",
                "cpu": "not limited (use docker or kubernetes for cpu quotas)",
            }
        )
        return report
    uid, _ = iso.sandbox_ids()
    user = "nobody (65534), in a user namespace of its own" if iso.is_root() else f"your uid ({uid})"
    if iso.is_root() and not found.user_namespace:
        user = "nobody (65534)"
    cgroup, no_cgroup = iso.pids_cgroup_parent()
    if cgroup:
        pids = (
            f"pids cgroup per sandbox (pids.max = spec.pids + {iso.ADAPTER_PROCESSES} for the adapter's own processes)"
        )
    elif iso.per_namespace_nproc() and (found.user_namespace or not iso.is_root()):
        pids = f"RLIMIT_NPROC inside the sandbox's own user namespace, counted per sandbox ({no_cgroup})"
    else:
        pids = f"NOT enforced: {no_cgroup}, and this kernel counts RLIMIT_NPROC per user, not per sandbox"
    report.update(
        {
            "isolation": f"{mode}: own user, PID, mount, IPC, UTS and network namespaces per sandbox",
            "user": f"commands run as {user}, with no capabilities and no-new-privileges",
            "filesystem": f"host root read-only; writable: the sandbox's work dir (at {iso.WORKSPACE}, the default "
            "cwd), spec.writable_dirs, its control dir and a private /tmp; your home, /home, /root and the other "
            "sandboxes hidden (but for the interpreter's dirs, read-only)",
            "processes": "the sandbox sees only its own (own /proc); they all end with it",
            "environment": "clean: PATH, HOME, LANG, TERM, the spec's env and ORCHARD_SANDBOX only",
            "network": "off unless the spec asks (own network namespace with loopback only); " + network_switching(),
            "output": "not spooled to disk: read from pipes, capped at the output cap",
            "pids": pids,
            "memory": "RLIMIT_AS (address space, per process) from spec.memory",
            "cpu": "not limited (use docker or kubernetes for cpu quotas)",
        }
    )
    return report


def network_switching() -> str:
    """What ``set_network`` can do for a local sandbox here, for doctor."""
    refusal = egress.namespace_refusal()
    if refusal:
        return f"set_network refused ({refusal})"
    return (
        "set_network switches a sandbox created offline (a veth pair to the host, "
        "an iptables allowlist in the sandbox's own namespace)" + egress.forwarding_note()
    )


class LocalAdapter:
    name = "local"
    capabilities = frozenset({Snapshots, Doctor, Facts})

    def __init__(
        self,
        *,
        root: str | Path | None = None,
        run_id: str | None = None,
        owner: str | None = None,
        isolation: str = "auto",
        output_cap: int = DEFAULT_OUTPUT_CAP,
        snapshot_ttl: float = SNAPSHOT_TTL,
    ):
        self.root = Path(root) if root else default_root()
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.owner = owner or f"{os.environ.get('USER', 'user')}@{os.uname().nodename}"
        self.requested_isolation = isolation
        self.isolation, self._probe = iso.resolve(isolation)
        self.output_cap = output_cap
        self.controller = names.controller_id()
        self._live: dict[str, tuple[ShellSandbox, anyio.abc.Process]] = {}
        self._snapshots: set[str] = set()  # made here and not dropped: reap leaves them alone
        self.snapshot_ttl = snapshot_ttl

    @property
    def facts(self) -> AdapterFacts:
        return AdapterFacts(host_dir=str(self.root))

    @property
    def namespaces(self) -> bool:
        return self.isolation != "none"

    async def create(self, spec: SandboxSpec) -> ShellSandbox:
        if not self.namespaces and self.requested_isolation != "none" and spec.network == "none":
            raise ConfigError(
                f"the local adapter cannot isolate a sandbox here ({self._probe.why}), so network='none' cannot "
                "hold; install bubblewrap, or pass isolation='none' to run without any isolation"
            )
        if spec.gpus:
            raise ConfigError(f"the local adapter gives sandboxes no GPU (gpus={spec.gpus}); use docker or kubernetes")
        if not self.namespaces and spec.writable_dirs:
            raise ConfigError(
                f"the local adapter without isolation cannot make writable_dirs {list(spec.writable_dirs)} "
                "(no mount namespace to make them in); install bubblewrap, or use docker"
            )
        # Shielded: a create cut short by cancellation would leave a process and a dir that
        # nobody holds. It takes tens of milliseconds; the caller's cancellation lands at
        # its next checkpoint, where it already owns the sandbox and destroys it.
        with anyio.CancelScope(shield=True):
            for _ in range(CREATE_ATTEMPTS - 1):
                with contextlib.suppress(CreateFailed):
                    # The host's mount table can change under a starting sandbox (container
                    # runtimes add and remove network namespaces); a second start sees another.
                    return await self._create(spec)
            return await self._create(spec)

    def _prepare_dirs(self, base: Path, lease: dict, plan: iso.Layout, writable_dirs: tuple[str, ...]) -> None:
        base.mkdir(parents=True)
        # The lease goes in before anything else: a controller killed from here on leaves a
        # dir that reap recognises as its (dead) own at once, instead of a lease-less dir it
        # must leave alone for 60 s (bench chaos --rounds 12 hit that window).
        (base / "lease.json").write_text(json.dumps(lease))
        for name in ("work", "ctl", "out"):
            (base / name).mkdir()
        iso.write_python_shims(base / "bin")
        (base / "ctl" / "shell.log").touch()
        writable = iso.host_dirs(base, plan.binds, writable_dirs)
        for path in writable:
            path.mkdir(parents=True, exist_ok=True)
        owner = self._owner()
        if owner is not None:  # root's sandboxes run as nobody: what they write is nobody's
            for path in (base / "work", base / "ctl", base / "ctl" / "shell.log", *writable):
                os.chown(path, *owner)
        make_output_pipes(str(base / "out"), owner)

    def _owner(self) -> tuple[int, int] | None:
        """Whom a sandbox's own dirs belong to, when not to the caller: root's run as nobody."""
        return iso.sandbox_ids() if iso.is_root() and self.namespaces else None

    @functools.cached_property
    def fork_method(self) -> tuple[str, str]:
        """How forks' work dirs are made here, and why not a better way (local_snapshot)."""
        return snaps.fork_method(str(self.root), self.isolation, self._probe.user_namespace)

    async def snapshot(self, sandbox: Sandbox) -> str:
        """Freeze ``sandbox``'s work dir (not its /tmp, not its processes) into a snapshot."""
        if sandbox.id not in self._live:
            raise ConfigError(f"sandbox {sandbox.id} is not a live sandbox of this adapter")
        method, _ = await anyio.to_thread.run_sync(lambda: self.fork_method)
        expires_at = time.time() + self.snapshot_ttl
        lease = names.lease_labels(owner=self.owner, run=self.run_id, expires_at=expires_at, controller=self.controller)
        work = self.root / sandbox.id / "work"
        with anyio.CancelScope(shield=True):  # a snapshot cut short would be a dir nobody holds
            try:
                taken = await anyio.to_thread.run_sync(
                    snaps.take, self.root, work, {**sandbox.labels, **lease}, expires_at, method
                )
            except OSError as exc:
                raise SandboxLost(f"could not snapshot {sandbox.id}: {exc}") from exc
            self._snapshots.add(taken)
        return taken

    async def drop_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot (idempotent). Forks still running from an overlay snapshot lose
        what they had not changed yet: drop it after its forks end."""
        self._snapshots.discard(snapshot_id)
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(snaps.drop, self.root, snapshot_id)

    async def doctor(self) -> str:
        method, why = await anyio.to_thread.run_sync(lambda: self.fork_method)
        isolation = self.isolation if self.namespaces else f"none ({self._probe.why})"
        switching = network_switching() if self.namespaces else "network: the host's, not switchable"
        return f"isolation {isolation}; {snaps.describe(method, why)}; {switching}"

    async def _create(self, spec: SandboxSpec) -> ShellSandbox:
        sandbox_id = f"lo-{uuid.uuid4().hex[:16]}"
        base = self.root / sandbox_id
        work, ctl = base / "work", base / "ctl"
        expires_at = time.time() + spec.ttl
        labels = {
            **spec.labels,
            **names.lease_labels(owner=self.owner, run=self.run_id, expires_at=expires_at, controller=self.controller),
        }
        lease = {"id": sandbox_id, "labels": labels, "expires_at": expires_at}
        tree = snaps.tree_of(self.root, spec.snapshot) if spec.snapshot else None
        plan = iso.layout(self.root, base, network=spec.network == "on", writable_dirs=spec.writable_dirs)
        inner = iso.sandbox_argv(self.isolation, plan, self._probe.user_namespace)
        supervisor = ["sh", "-c", SUPERVISOR, TIMER_NAME, str(int(spec.ttl) + 1), "ns" if self.namespaces else ""]
        if spec.max_extension:
            supervisor += [str(base / DEADLINE_FILE), str(math.ceil(expires_at + spec.max_extension))]
        argv = [
            *default_signals_argv(),
            *["sh", "-c", GATE, "gate", str(base), iso.LAUNCHER, self.isolation, *inner, *supervisor],
        ]
        # Inside a mount namespace the work dir is WORKSPACE, as in a container; without one
        # (isolation "none") it can only be its host path.
        workdir = iso.WORKSPACE if self.namespaces else str(work)
        env = {
            "PATH": f"{base / 'bin'}:{iso.SYSTEM_PATH}",
            "HOME": workdir,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            **spec.env,
            SANDBOX_ENV: str(base),
        }
        # The process first, the sandbox's directory after: a controller killed in between
        # leaves a gate that sees EOF and removes what was made (see GATE).
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            process = await anyio.open_process(
                argv, stderr=subprocess.DEVNULL, cwd=self.root, env=env, start_new_session=True
            )
        except OSError as exc:
            raise CreateFailed(f"could not start the sandbox shell: {exc}") from exc
        assert process.stdin is not None and process.stdout is not None
        cgroup = ""
        try:
            self._prepare_dirs(base, lease, plan, spec.writable_dirs)
            if spec.max_extension:
                _write_deadline(base, expires_at)
            if tree is not None:
                if self.fork_method[0] == "overlay":  # two mkdirs and a mount: no thread hop for that
                    snaps.fork_into(tree, base, "overlay", self._owner())
                else:
                    await anyio.to_thread.run_sync(snaps.fork_into, tree, base, self.fork_method[0], self._owner())
            cgroup = iso.make_pids_cgroup(sandbox_id, spec.pids) if spec.pids and self.namespaces else ""
            # Read back through a handle kept open: a launcher that fails removes the sandbox
            # dir, log included, before the error would be read by path.
            log_reader = open(ctl / "shell.log", "a+b")  # noqa: SIM115 (closed below, on every path)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await process.stdin.aclose()  # the gate removes the directory
                await process.wait()
                snaps.remove_sandbox_dir(base)
                iso.remove_cgroup(cgroup)
            raise
        server = _ServerPid()
        client = ShellClient(
            StapledByteStream(process.stdin, process.stdout),
            workdir=workdir,
            interrupt=functools.partial(self._interrupt, server),
            output_cap=self.output_cap,
            output_pipes=str(base / "out"),
        )
        try:
            await process.stdin.send(f"go {cgroup or '-'}\n".encode())
            limits = self._limits(spec, cgroup)
            if limits:
                await process.stdin.send(limits.encode())
            await client.start(str(ctl))
            server.pid = _host_pid(process.pid, client.server_pid, nested=self.namespaces)
        except (SandboxLost, OSError, anyio.BrokenResourceError) as exc:
            await client.close()
            await self._stop(process, base, cgroup)
            log_tail = _tail(log_reader)
            log_reader.close()
            raise CreateFailed(
                f"the sandbox shell did not start ({exc}; exit {process.returncode}): {log_tail or 'no output'}"
            ) from exc
        log_reader.close()

        async def server_pid() -> int:
            return server.pid

        egress = NamespaceEgress(server_pid, sandbox_id)

        async def teardown() -> None:
            self._live.pop(sandbox_id, None)
            # Found before EOF reaches the shell: after it, the namespace often ends by itself
            # before _stop runs, which leaves no init to find and costs a sweep.
            init = NamespaceInit.of(process.pid) if self.namespaces else None
            await client.close()
            await self._stop(process, base, cgroup, init)
            await egress.close()

        sandbox = ShellSandbox(
            id=sandbox_id,
            client=client,
            # Its file operations run as its commands do, under the same isolation: any
            # path a command can read, they can (its work dir being WORKSPACE).
            root="/",
            labels=labels,
            on_close=teardown,
            expires_at=expires_at,
            stream_opener=functools.partial(self._open_stream, base),
            network=NetworkSwitch(spec_network(spec.network), egress.enforce, refusal=self._network_refusal(spec)),
            ttl_extender=functools.partial(self._extend, base, lease),
            max_extension=spec.max_extension,
        )
        self._live[sandbox_id] = (sandbox, process)
        return sandbox

    def _network_refusal(self, spec: SandboxSpec) -> str:
        """Why a sandbox of ``spec`` cannot have its network switched here ("" when it can)."""
        if not self.namespaces:
            return "a local sandbox without isolation is on the host's network: it cannot be switched"
        if spec.network == "on":
            return (
                "a local sandbox created with network='on' shares the host's network namespace: "
                "create it with network='none' to switch its network"
            )
        return egress.namespace_refusal()

    @staticmethod
    async def _extend(base: Path, lease: dict, expires_at: float) -> None:
        """Move a sandbox's expiry (ShellSandbox.extend_ttl): the deadline its timer re-reads
        (SUPERVISOR), then the lease reap reads, so another controller's reap keeps it too."""
        _write_deadline(base, expires_at)
        lease["expires_at"] = expires_at
        lease["labels"][names.EXPIRES] = str(int(expires_at))
        _replace_file(base / "lease.json", json.dumps(lease))

    async def _open_stream(self, base: Path, sandbox: ShellSandbox, command: list[str]) -> anyio.abc.ByteStream:
        """Start ``command`` in the sandbox on two fresh FIFOs, its stdin and stdout, and
        return their other ends. They live in ``out/``, which the sandbox sees read-only: it
        can open them but not swap them for something else under the controller's feet.

        The shell server starts the command in the background (one short command); its
        redirections open stdout first, then stdin, so once the controller's write end of
        stdin opens, the process holds both and an end of stdout means the process is done."""
        name = uuid.uuid4().hex[:12]
        stdin_path, stdout_path = base / "out" / f"{name}.in", base / "out" / f"{name}.out"
        owner = iso.sandbox_ids() if iso.is_root() and self.namespaces else None
        fds: list[int] = []

        def remove_fifos() -> None:
            for path in (stdin_path, stdout_path):
                path.unlink(missing_ok=True)

        try:
            for path in (stdin_path, stdout_path):
                os.mkfifo(path, 0o600)
                if owner is not None:
                    os.chown(path, *owner)
            fds.append(os.open(stdout_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
            start = (
                f"{' '.join(map(quote, command))} >{quote(str(stdout_path))} <{quote(str(stdin_path))} 2>/dev/null &"
            )
            result = await sandbox.exec(start, timeout=STREAM_START_TIMEOUT)
            if result.reason.is_infra or result.exit_code != 0:
                raise SandboxLost(f"could not start a stream process in {sandbox.id}: {result.error_text.strip()}")
            with anyio.fail_after(STREAM_START_TIMEOUT):
                while True:
                    try:
                        fds.append(os.open(stdin_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))
                        break
                    except OSError as exc:  # ENXIO: the process has not opened its stdin yet
                        if exc.errno != errno.ENXIO:
                            raise
                    await anyio.sleep(0.001)
        except BaseException as exc:
            for fd in fds:
                os.close(fd)
            remove_fifos()
            if isinstance(exc, TimeoutError):
                raise SandboxLost(f"the stream process in {sandbox.id} did not open its stdin") from None
            raise
        return PipeStream(fds[0], fds[1], on_close=remove_fifos)

    @staticmethod
    async def _interrupt(server: _ServerPid, client: ShellClient) -> None:
        """Signal the sandbox shell that its command timed out (see orchard_async.kit.shell)."""
        if server.pid:
            try:
                os.kill(server.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass  # the shell is gone; the client will see EOF

    def _limits(self, spec: SandboxSpec, cgroup: str) -> str:
        lines = []
        if spec.memory_bytes:
            lines.append(f"ulimit -v {spec.memory_bytes // 1024}")
        # RLIMIT_NPROC counts a user's processes in one user namespace (Linux 5.14+): inside
        # the sandbox's own, that is the sandbox. Elsewhere it would count every process of
        # the user, so it is not set: an unrelated process must not be able to starve a sandbox.
        own_user_namespace = self._probe.user_namespace or not iso.is_root()
        if spec.pids and not cgroup and self.namespaces and own_user_namespace and iso.per_namespace_nproc():
            lines.append(f"ulimit -p {spec.pids + iso.ADAPTER_PROCESSES}")
        return "".join(line + "\n" for line in lines)

    async def _stop(
        self, process: anyio.abc.Process, base: Path, cgroup: str, init: NamespaceInit | None = None
    ) -> None:
        """End the sandbox; return when none of its processes is left. With a PID namespace,
        its init is killed (the kernel kills the rest) and its pidfd says when all are gone;
        without one, EOF makes the shell end and clean up, past the grace period it is forced,
        and the sweeper kills what is left (orphans of finished commands went to the host's
        init). A sandbox's close no longer waits for its command to end: everything in it is
        SIGKILLed on the way out either way (SUPERVISOR).

        ``init`` is found as the sandbox closes, not held from its start (a pidfd per live
        sandbox would be a third file descriptor each), and killed here, after the pipes are
        closed: killing it first, in an abort storm, made the other episodes' cancellations
        wait behind 256 sandboxes' deaths (close 2.3-5.0 s instead of 1.6-2.3 s at load 13-16)."""
        with anyio.CancelScope(shield=True):
            try:
                if init is not None:
                    init.kill()
                with anyio.move_on_after(DESTROY_GRACE):
                    await process.wait()
                forced = process.returncode is None
                if forced:  # what the launcher started on the host may outlive it
                    _kill_quietly(process.pid)
                    await process.wait()
                # The launcher can return while the namespace is still emptying (bwrap's outer
                # process exits with the sandbox's first process, not with its init).
                if forced or init is None or not await _until_gone(init, DESTROY_GRACE):
                    await self._sweeper.sweep({str(base)})
            finally:
                if init is not None:
                    init.close()
            if base.exists():
                await anyio.to_thread.run_sync(snaps.remove_sandbox_dir, base)
            iso.remove_cgroup(cgroup)

    @functools.cached_property
    def _sweeper(self) -> Sweeper:
        return Sweeper()

    async def list_owned(self) -> list[str]:
        return list(self._live)

    async def reap(self, older_than: float = 0.0) -> list[str]:
        keep = set(self._live) | self._snapshots
        removed = await anyio.to_thread.run_sync(reap_local, self.root, older_than, keep)
        await anyio.to_thread.run_sync(iso.reap_cgroups, set(removed), set(self._live))
        return removed

    async def close(self) -> None:
        async with anyio.create_task_group() as tg:
            for sandbox, _ in list(self._live.values()):
                tg.start_soon(sandbox.close)

    async def __aenter__(self) -> LocalAdapter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _write_deadline(base: Path, expires_at: float) -> None:
    """The deadline an extendable sandbox's timer re-reads (SUPERVISOR), in whole seconds."""
    _replace_file(base / DEADLINE_FILE, f"{math.ceil(expires_at)}\n")


def _replace_file(path: Path, text: str) -> None:
    """Write ``path`` whole, at once: a reader (the sandbox's timer, a reap) sees the old text
    or the new one, never a part."""
    staged = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    staged.write_text(text)
    os.replace(staged, path)


def _tail(log: BinaryIO, size: int = 400) -> str:
    """The end of a log, on one line."""
    try:
        log.seek(0)
        return " | ".join(log.read()[-size:].decode(errors="replace").split("\n")).strip(" |")
    except OSError:
        return ""


async def _until_gone(init: NamespaceInit, timeout: float) -> bool:
    """Whether the sandbox's PID namespace emptied within ``timeout`` seconds: its init's
    pidfd turns readable then, which the event loop waits for (no polling in a storm)."""
    with anyio.move_on_after(timeout):
        await anyio.wait_readable(init.fd)
    return init.gone()


class _ServerPid:
    """The host pid of a sandbox's shell server, found once it answers."""

    pid = 0


def _host_pid(launcher: int, sandbox_pid: int, *, nested: bool) -> int:
    """The host pid of the process a sandbox knows as ``sandbox_pid``: the descendant of the
    launcher whose innermost PID-namespace pid it is (NSpid's last field; ``nested`` when the
    sandbox has a PID namespace of its own, so that NSpid has more than one)."""
    queue = [launcher]
    while queue:
        pid = queue.pop()
        try:
            ns_pids = procfs.ns_pids(pid)
            if ns_pids and ns_pids[-1] == sandbox_pid and (len(ns_pids) > 1) == nested:
                return pid
            queue += procfs.children(pid)
        except ValueError:
            continue
    return 0

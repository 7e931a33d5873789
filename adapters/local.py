"""The local adapter: sandboxes as plain processes, the embedded default.

Each sandbox is a private directory ``<root>/<id>/`` (``work/`` for the agent, ``ctl/``
for the shell protocol, ``lease.json`` for reap) and one persistent ``sh`` speaking the
shell-session protocol over pipes. Where the kernel lets us, the shell runs as PID 1 of
new PID, mount and network namespaces (``unshare``): when it ends, the kernel kills
everything inside, and the network is only a loopback that is down. Without namespaces
it still runs in its own session and kills the process groups it started.

A small supervisor shell owns each sandbox's lifetime (see ``SUPERVISOR``): it is PID 1
of the namespaces, runs the shell-session server as its child, kills that server when the
TTL passes, and when the server ends, for whatever reason, kills everything left in the
sandbox and removes its directory. So a SIGKILLed controller leaves nothing behind: the
server sees EOF on its pipe and ends, and the TTL ends it regardless. ``reap`` finds
leftovers by lease file and by the ``ORCHARD_SANDBOX`` variable (the sandbox's directory)
every process of a sandbox inherits.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import anyio
from anyio.streams.stapled import StapledByteStream

from orchard_async.errors import CreateFailed, SandboxLost
from orchard_async.lease import CONTROLLER_LABEL, controller_alive, controller_id
from orchard_async.protocols import Sandbox
from orchard_async.sandbox import ShellSandbox
from orchard_async.shell import ShellClient
from orchard_async.types import DEFAULT_OUTPUT_CAP, SandboxSpec

SANDBOX_ENV = "ORCHARD_SANDBOX"  # the sandbox dir: names the sandbox and the root it lives in
DESTROY_GRACE = 5.0

# `$1` TTL seconds, `$2` the sandbox dir. stdin is the controller's pipe, passed to the server.
# Traps run while the supervisor waits (POSIX `wait` returns on a trapped signal), which a
# shell blocked reading commands does not do: that is why the TTL lives here, not in the server.
SUPERVISOR = r"""
exec 3<&0 0</dev/null
sh -s <&3 3<&- &
server=$!
exec 3<&-
trap 'kill -USR1 $server 2>/dev/null' USR1
(sleep "$1"; kill -KILL $server) </dev/null >/dev/null 2>&1 &
while :; do wait $server; kill -0 $server 2>/dev/null || break; done
if [ $$ = 1 ]; then kill -KILL -1 2>/dev/null; fi
rm -rf -- "$2"
"""


def default_root() -> Path:
    return Path(os.environ.get("ORCHARD_LOCAL_ROOT") or Path(tempfile.gettempdir()) / "orchard-async")


@functools.cache
def namespace_support() -> tuple[bool, str]:
    """Can this process give a sandbox new PID, mount and network namespaces?"""
    if shutil.which("unshare") is None:
        return False, "unshare(1) is not installed"
    probe = ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--net", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"unshare failed: {exc}"
    if done.returncode != 0:
        return False, f"unshare refused: {done.stderr.decode(errors='replace').strip()}"
    return True, "new PID, mount and network namespaces per sandbox"


def isolation_report() -> dict[str, str]:
    """What the local adapter enforces on this machine, for `orchard-async doctor`."""
    ns_ok, ns_why = namespace_support()
    root = os.geteuid() == 0
    return {
        "process group": "yes: own session; a timeout kills the command's whole process group",
        "namespaces": ns_why if ns_ok else f"no ({ns_why}): processes share the host's PID and network namespaces",
        "network": "off unless the spec asks (empty network namespace)"
        if ns_ok
        else "NOT isolated: no network namespace",
        "memory": "RLIMIT_AS (address space) from spec.memory",
        "pids": "not enforced: RLIMIT_NPROC does not apply to root" if root else "RLIMIT_NPROC from spec.pids",
        "cpu": "not limited (use docker or kubernetes for cpu quotas)",
        "filesystem": "private work dir; the rest of the host filesystem is visible",
    }


class LocalAdapter:
    name = "local"

    def __init__(
        self,
        *,
        root: str | Path | None = None,
        run_id: str | None = None,
        owner: str | None = None,
        namespaces: bool | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ):
        self.root = Path(root) if root else default_root()
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.owner = owner or f"{os.environ.get('USER', 'user')}@{os.uname().nodename}"
        self.namespaces = namespace_support()[0] if namespaces is None else namespaces
        self.output_cap = output_cap
        self.controller = controller_id()
        self._live: dict[str, tuple[ShellSandbox, anyio.abc.Process]] = {}

    async def create(self, spec: SandboxSpec) -> Sandbox:
        # Shielded: a create cut short by cancellation would leave a process and a dir that
        # nobody holds. It takes tens of milliseconds; the caller's cancellation lands at
        # its next checkpoint, where it already owns the sandbox and destroys it.
        with anyio.CancelScope(shield=True):
            return await self._create(spec)

    async def _create(self, spec: SandboxSpec) -> Sandbox:
        sandbox_id = f"lo-{uuid.uuid4().hex[:16]}"
        base = self.root / sandbox_id
        work, ctl = base / "work", base / "ctl"
        base.mkdir(parents=True)
        expires_at = time.time() + spec.ttl
        labels = {
            **spec.labels,
            "orchard.owner": self.owner,
            "orchard.run": self.run_id,
            "orchard.expires": str(int(expires_at)),
            CONTROLLER_LABEL: self.controller,
        }
        lease = {"id": sandbox_id, "labels": labels, "expires_at": expires_at}
        # The lease goes in before anything else: a controller killed from here on leaves a
        # dir that reap recognises as its (dead) own at once, instead of a lease-less dir it
        # must leave alone for 60 s (bench chaos --rounds 12 hit that window).
        (base / "lease.json").write_text(json.dumps(lease))
        work.mkdir()
        ctl.mkdir()
        argv = ["sh", "-c", SUPERVISOR, "supervisor", str(int(spec.ttl) + 1), str(base)]
        if self.namespaces:
            net = ["--net"] if spec.network == "none" else []
            argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", *net, *argv]
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(work),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            **spec.env,
            SANDBOX_ENV: str(base),
        }
        with open(ctl / "shell.log", "ab") as log:
            try:
                process = await anyio.open_process(argv, stderr=log, cwd=work, env=env, start_new_session=True)
            except OSError as exc:
                shutil.rmtree(base, ignore_errors=True)
                raise CreateFailed(f"could not start the sandbox shell: {exc}") from exc
        assert process.stdin is not None and process.stdout is not None
        client = ShellClient(
            StapledByteStream(process.stdin, process.stdout),
            workdir=str(work),
            interrupt=functools.partial(self._interrupt, process),
            output_cap=self.output_cap,
        )
        try:
            limits = self._limits(spec)
            if limits:
                await process.stdin.send(limits.encode())
            await client.start(str(ctl))
        except (SandboxLost, OSError, anyio.BrokenResourceError) as exc:
            await client.aclose()
            await self._stop(process, base)
            raise CreateFailed(f"the sandbox shell did not start ({exc}); see {ctl / 'shell.log'}") from exc

        async def teardown() -> None:
            self._live.pop(sandbox_id, None)
            await client.aclose()
            await self._stop(process, base)

        sandbox = ShellSandbox(
            id=sandbox_id, client=client, root=str(base), labels=labels, on_close=teardown, expires_at=expires_at
        )
        self._live[sandbox_id] = (sandbox, process)
        return sandbox

    async def _interrupt(self, process: anyio.abc.Process, client: ShellClient) -> None:
        """Signal the sandbox shell that its command timed out (see orchard_async.shell);
        the supervisor passes the signal on to the server."""
        pid = process.pid
        if self.namespaces:  # the supervisor is unshare's only child
            try:
                pid = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                return  # the shell is gone; the client will see EOF
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass

    @staticmethod
    def _limits(spec: SandboxSpec) -> str:
        lines = []
        if spec.memory_bytes:
            lines.append(f"ulimit -v {spec.memory_bytes // 1024}")
        if spec.pids and os.geteuid() != 0:
            lines.append(f"ulimit -p {spec.pids}")
        return "".join(line + "\n" for line in lines)

    async def _stop(self, process: anyio.abc.Process, base: Path) -> None:
        """EOF makes the shell end and clean up; past the grace period, force it."""
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(DESTROY_GRACE):
                await process.wait()
            if process.returncode is None:
                _kill_quietly(process.pid)
                await process.wait()
            if not self.namespaces:  # orphans of finished commands went to the host's init
                await anyio.to_thread.run_sync(_kill_sandbox_processes, {str(base)})
            if base.exists():
                await anyio.to_thread.run_sync(shutil.rmtree, base, True)

    async def destroy(self, sandbox: Sandbox) -> None:
        await sandbox.close()

    async def list_owned(self) -> list[str]:
        return list(self._live)

    async def reap(self, older_than: float = 0.0) -> list[str]:
        return await anyio.to_thread.run_sync(reap_local, self.root, older_than, set(self._live))

    async def close(self) -> None:
        async with anyio.create_task_group() as tg:
            for sandbox, _ in list(self._live.values()):
                tg.start_soon(sandbox.close)


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _sandbox_processes() -> dict[str, list[int]]:
    """Every process on the host that belongs to some local sandbox, by sandbox dir."""
    marker = SANDBOX_ENV.encode() + b"="
    found: dict[str, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        for var in environ.split(b"\0"):
            if var.startswith(marker):
                found.setdefault(var[len(marker) :].decode(), []).append(int(entry.name))
                break
    return found


def _kill_sandbox_processes(dirs: set[str]) -> None:
    for sandbox_dir, pids in _sandbox_processes().items():
        if sandbox_dir in dirs:
            for pid in pids:
                _kill_quietly(pid)


def _lease_is_dead(lease: dict, now: float, older_than: float) -> bool:
    if lease.get("expires_at", 0) + older_than < now:
        return True
    return controller_alive(lease.get("labels", {}).get(CONTROLLER_LABEL, "")) is not True


def reap_local(root: Path, older_than: float = 0.0, keep: set[str] | None = None) -> list[str]:
    """Remove sandboxes whose controller is dead or whose TTL has passed; return their ids.

    Also kills stray processes of sandboxes whose directory is already gone.
    """
    keep = keep or set()
    now = time.time()
    doomed: set[str] = set()
    live_dirs: set[str] = set()
    if root.exists():
        for base in root.iterdir():
            try:
                lease = json.loads((base / "lease.json").read_text())
            except (OSError, ValueError):
                # A dir without a readable lease is a half-created sandbox; leave young ones.
                if base.is_dir() and now - base.stat().st_mtime > 60 and base.name not in keep:
                    doomed.add(base.name)
                continue
            live_dirs.add(base.name)
            if base.name not in keep and _lease_is_dead(lease, now, older_than):
                doomed.add(base.name)
    # Processes of this root's sandboxes, by id; other roots are other users' business.
    processes = {
        Path(sandbox_dir).name: pids
        for sandbox_dir, pids in _sandbox_processes().items()
        if Path(sandbox_dir).parent == root
    }
    orphans = {sid for sid in processes if sid not in live_dirs and sid not in keep}
    for sandbox_id in doomed | orphans:
        for pid in processes.get(sandbox_id, []):
            _kill_quietly(pid)
        shutil.rmtree(root / sandbox_id, ignore_errors=True)
    return sorted(doomed | orphans)

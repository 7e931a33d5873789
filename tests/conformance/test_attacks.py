"""Attacks from inside a sandbox, as the sandbox's own user: every one must fail, on every
adapter with a shell (local under each isolation mode, docker, kubernetes).

Each test also proves, where that is cheap, that the attack would have worked without the
boundary (the host listener accepts the test's own connection, the canary is readable in
the host's /proc, the probe tool works inside the sandbox), so a test cannot pass because
the attack was broken. The probes use only what busybox has (sh, cat, nc, nsenter, ...),
with python3 where the sandbox has it.

Where a backend cannot enforce a rule in CI, the test skips for that adapter only and says
why; those skips are the adapter's documented limits, not gaps in the suite.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async.kit.shell import quote

ATTACK_TIMEOUT = 60.0


async def run(box: oa.Sandbox, script: str, *, timeout: float = ATTACK_TIMEOUT) -> tuple[oa.ExecResult, str]:
    result = await box.exec(script, timeout=timeout)
    return result, (result.stdout + result.stderr).decode(errors="replace")


@contextmanager
def host_listener(address: str) -> Iterator[tuple[int, list[str]]]:
    """A TCP listener on the host that accepts and closes; yields its port and the peers seen."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, 0))
    server.listen(64)
    server.settimeout(0.2)
    peers: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except (TimeoutError, OSError):
                continue
            peers.append(peer[0])
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], peers
    finally:
        stop.set()
        thread.join(5)
        server.close()


def prove_reachable_from_host(address: str, port: int, peers: list[str]) -> None:
    """The attack would work without a boundary: the host itself gets through."""
    with socket.create_connection((address, port), timeout=5):
        pass
    deadline = time.monotonic() + 5
    while not peers and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(peers) == 1, "the host listener did not accept the host's own connection"


# Tries one TCP connection with whatever the sandbox has; prints TOOL <name>, and CONNECTED
# only when a connection was made. `$1` host, `$2` port.
CONNECT = r"""
_connect() {
  if command -v python3 >/dev/null 2>&1; then
    echo TOOL python3
    python3 -c 'import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3); print("CONNECTED")' "$1" "$2" 2>/dev/null
  elif command -v nc >/dev/null 2>&1; then
    echo TOOL nc
    if echo x | nc -w 3 "$1" "$2" >/dev/null 2>&1; then echo CONNECTED; fi
  elif command -v busybox >/dev/null 2>&1; then
    echo TOOL busybox-nc
    if echo x | busybox nc -w 3 "$1" "$2" >/dev/null 2>&1; then echo CONNECTED; fi
  else
    echo TOOL none
  fi
}
"""

# Proves the probe tool connects at all: a listener on the sandbox's own loopback.
SELF_TEST = r"""
if command -v python3 >/dev/null 2>&1; then
  python3 -c '
import socket
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
socket.create_connection(server.getsockname(), timeout=3); print("SELF CONNECTED")'
else
  nc=nc; command -v nc >/dev/null 2>&1 || nc="busybox nc"
  ($nc -l -p 39917 >/dev/null 2>&1 &) ; sleep 0.5
  if echo x | $nc -w 3 127.0.0.1 39917 >/dev/null 2>&1; then echo SELF CONNECTED; fi
fi
"""


async def assert_probe_works(box: oa.Sandbox) -> None:
    _, out = await run(box, SELF_TEST)
    assert "SELF CONNECTED" in out, f"the connect probe does not work inside this sandbox, so it proves nothing: {out}"


def read_host_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def remove_host_files(paths: list[str]) -> list[str]:
    """Delete those of paths that exist on the host; return which did."""
    found = [path for path in paths if os.path.lexists(path)]
    for path in found:
        os.unlink(path)
    return found


def host_address() -> str | None:
    """A non-loopback IPv4 address of this host, if it has one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") or address == "0.0.0.0" else address


# -- the controller's environment --------------------------------------------------------


@pytest.fixture
def canary(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A secret in the controller's environment and in a host process's initial environment
    (os.environ changes do not show in /proc/<pid>/environ; a child's exec environment does)."""
    secret = "orchard-canary-" + secrets.token_hex(12)
    monkeypatch.setenv("ORCHARD_ATTACK_CANARY", secret)
    holder = subprocess.Popen(["sleep", "600"], env={**os.environ, "ORCHARD_ATTACK_CANARY": secret})
    try:
        # Proof: without a PID namespace and a user boundary, this is one `cat` away (once the
        # holder has exec'd: until then its environ is its parent's, or empty).
        deadline = time.monotonic() + 10
        while secret.encode() not in read_host_file(f"/proc/{holder.pid}/environ"):
            assert time.monotonic() < deadline, "the canary never showed in the holder's /proc environ"
            time.sleep(0.02)
        yield secret
    finally:
        holder.kill()
        holder.wait()


async def test_cannot_read_the_controllers_environment(make_adapter: Callable[..., oa.Adapter], canary: str) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        script = rf"""
env
umount -l /proc 2>/dev/null  # as root without a user boundary, this uncovers the host's /proc
for f in /proc/[0-9]*/environ /proc/[0-9]*/task/[0-9]*/environ /proc/{os.getpid()}/environ /proc/{os.getppid()}/environ; do
  cat "$f" 2>/dev/null | tr '\0' '\n'
done
p=$$
while [ -n "$p" ] && [ "$p" -gt 0 ] 2>/dev/null; do
  cat /proc/$p/environ 2>/dev/null | tr '\0' '\n'
  pp=
  while read -r key value; do if [ "$key" = PPid: ]; then pp=$value; fi; done </proc/$p/status
  [ "$pp" = "$p" ] && break
  p=$pp
done
echo SCANNED
"""
        result, out = await run(box, script)
        assert "SCANNED" in out, out
        assert canary not in out, "the sandbox read the controller's environment"
    finally:
        await box.close()


# -- the network ------------------------------------------------------------------------------


async def test_cannot_reach_the_hosts_loopback(make_adapter: Callable[..., oa.Adapter]) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        await assert_probe_works(box)
        with host_listener("127.0.0.1") as (port, peers):
            prove_reachable_from_host("127.0.0.1", port, peers)
            _, out = await run(box, CONNECT + f"_connect 127.0.0.1 {port}")
            assert "TOOL none" not in out, "no connect tool in the sandbox"
            assert "CONNECTED" not in out and len(peers) == 1, f"the sandbox reached the host's loopback: {out}"
    finally:
        await box.close()


async def test_cannot_reach_another_address_of_the_host(make_adapter: Callable[..., oa.Adapter]) -> None:
    adapter = make_adapter()
    address = host_address()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address (no default route) to attack")
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        await assert_probe_works(box)
        with host_listener(address) as (port, peers):
            prove_reachable_from_host(address, port, peers)
            _, out = await run(box, CONNECT + f"_connect {address} {port}")
            assert "TOOL none" not in out, "no connect tool in the sandbox"
            assert "CONNECTED" not in out and len(peers) == 1, f"the sandbox reached {address}: {out}"
    finally:
        await box.close()


async def test_cannot_nsenter_the_hosts_namespaces(make_adapter: Callable[..., oa.Adapter]) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        with host_listener("127.0.0.1") as (port, peers):
            prove_reachable_from_host("127.0.0.1", port, peers)
            script = (
                CONNECT
                + f"""
if nsenter -t 1 -n -m true 2>/dev/null; then echo ENTERED-PID1; fi
nsenter -t 1 -n -- sh -c {quote(CONNECT + f"_connect 127.0.0.1 {port}")} 2>/dev/null
for ns in /proc/[0-9]*/ns/net; do
  if nsenter --net="$ns" true 2>/dev/null; then echo "ENTERED $ns"; fi
done
echo TRIED
"""
            )
            _, out = await run(box, script)
            assert "TRIED" in out, out
            assert "ENTERED" not in out, f"nsenter worked inside the sandbox: {out}"
            assert "CONNECTED" not in out and len(peers) == 1, f"the sandbox reached the host through nsenter: {out}"
    finally:
        await box.close()


# -- files -------------------------------------------------------------------------------------


async def test_cannot_read_or_write_another_sandboxs_files(make_adapter: Callable[..., oa.Adapter]) -> None:
    adapter = make_adapter()
    attacker = await adapter.create(oa.SandboxSpec(ttl=300))
    victim = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        secret = "victim-secret-" + secrets.token_hex(8)
        await victim.write_file("secret.txt", secret)
        # local: the victim's work dir by its host path (each sandbox sees its own at /workspace)
        victim_work = f"{adapter.root}/{victim.id}/work" if adapter.name == "local" else victim.workdir
        target = f"{victim_work}/secret.txt"
        roots = [victim_work]
        if adapter.name == "local":
            assert read_host_file(target) == secret.encode()  # proof: it is a plain path on the host
            roots += [f"{adapter.root}/{victim.id}", str(adapter.root)]
        script = f"""
cat {quote(target)} 2>/dev/null
for r in /proc/[0-9]*/root; do cat "$r"{quote(target)} 2>/dev/null; done
for d in {" ".join(quote(r) for r in roots)}; do
  cat "$d"/*/work/secret.txt "$d"/*/*/secret.txt 2>/dev/null
  echo pwned >"$d/pwned" 2>/dev/null && echo "WROTE $d"
done
echo pwned >{quote(victim_work + "/pwned.txt")} 2>/dev/null
echo pwned >{quote(target)} 2>/dev/null
echo DONE
"""
        _, out = await run(attacker, script)
        assert "DONE" in out, out
        assert secret not in out, "the sandbox read another sandbox's file"
        assert (await victim.read_file("secret.txt")).decode() == secret, "the sandbox overwrote another's file"
        names = {entry.name for entry in await victim.list_dir(".")}
        assert "pwned.txt" not in names and "pwned" not in names, "the sandbox wrote into another's work dir"
        if adapter.name == "local":
            assert not (adapter.root / "pwned").exists(), "the sandbox wrote into the adapter's root"
    finally:
        await attacker.close()
        await victim.close()


async def test_cannot_write_outside_the_work_dir_and_tmp(make_adapter: Callable[..., oa.Adapter]) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    name = "orchard-attack-" + secrets.token_hex(6)
    targets = ["/etc", "/usr", "/bin", "/var/tmp", "/", str(Path.home()), "/tmp"]
    if adapter.name == "local":
        targets += [str(adapter.root), f"{adapter.root}/{box.id}"]
    try:
        script = "".join(f'echo pwned >{quote(t + "/" + name)} 2>/dev/null && echo "WROTE {t}"\n' for t in targets)
        _, out = await run(box, script + "echo DONE")
        assert "DONE" in out, out
        on_host = remove_host_files([os.path.join(t, name) for t in targets])
        assert not on_host, f"the sandbox wrote these host dirs: {on_host}"
        if adapter.name == "local":
            # The sandbox sees the host's paths: writes must fail there, except in its private /tmp
            # (which holds the adapter root's path when that root is under /tmp).
            wrote = [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("WROTE ")]
            escaped = [t for t in wrote if not (t == "/tmp" or t.startswith("/tmp/"))]
            assert not escaped, f"writes outside the work dir and /tmp succeeded: {escaped}"
            assert "/tmp" in wrote, f"the private /tmp must be writable: {out}"
        assert (await box.exec(f"echo ok >{quote(box.workdir + '/' + name)}")).ok, "the work dir must stay writable"
    finally:
        await box.close()


async def test_cannot_read_etc_shadow(make_adapter: Callable[..., oa.Adapter]) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        result, out = await run(box, "cat /etc/shadow")
        if adapter.name == "local":
            assert result.exit_code != 0, f"the sandbox read /etc/shadow: {out[:200]}"
        host_shadow = read_host_file("/etc/shadow")  # empty when the test runs unprivileged
        if host_shadow.strip():
            assert host_shadow not in result.stdout, "the sandbox read the host's /etc/shadow"
    finally:
        await box.close()


async def test_cannot_unmount_or_mount(make_adapter: Callable[..., oa.Adapter]) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        script = """
umount /proc 2>/dev/null && echo UNMOUNTED
umount -l /proc 2>/dev/null && echo UNMOUNTED-LAZY
mkdir -p mnt && mount -t tmpfs none mnt 2>/dev/null && echo MOUNTED
mount -o remount,rw / 2>/dev/null && echo REMOUNTED
if [ -r /proc/self/status ]; then echo PROC-STILL-MOUNTED; fi
"""
        _, out = await run(box, script)
        lines = out.splitlines()
        for word in ("UNMOUNTED", "UNMOUNTED-LAZY", "MOUNTED", "REMOUNTED"):
            assert word not in lines, f"{word} succeeded inside the sandbox: {out}"
        assert "PROC-STILL-MOUNTED" in lines, out
        assert (await box.exec("echo usable")).text == "usable\n"
    finally:
        await box.close()


# -- resources -------------------------------------------------------------------------------

# Starts 64 background sleeps from a child shell (a shell that cannot fork ends, so the child
# takes that), recording their pids; then counts, with builtins only (nothing to fork at the
# limit), the bomb's processes still alive and every process the sandbox can see, and kills
# the bomb's processes so the sandbox stays usable.
FORK_BOMB = r"""
rm -f bomb.pids
sh -c 'i=0; while [ $i -lt 64 ]; do sleep 123 & echo $! >>bomb.pids; i=$((i+1)); done' 2>/dev/null
alive=0; started=
while read -r p; do if kill -0 "$p" 2>/dev/null; then alive=$((alive+1)); started="$started $p"; fi; done <bomb.pids
n=0; for p in /proc/[0-9]*; do if [ -r "$p/stat" ]; then n=$((n+1)); fi; done
echo "BOMB $alive"
echo "PROCESSES $n"
kill $started 2>/dev/null
"""


def reported(out: str, word: str) -> int:
    for line in out.splitlines():
        if line.startswith(word + " "):
            return int(line.split()[1])
    raise AssertionError(f"the fork bomb did not report {word}: {out}")


async def test_fork_bomb_stops_at_the_pids_limit(make_adapter: Callable[..., oa.Adapter]) -> None:
    adapter = make_adapter()
    if adapter.name == "kubernetes":
        pytest.skip(
            "kubernetes: a pod spec has no pids field, so spec.pids cannot be set per sandbox; the limit is the "
            "kubelet's podPidsLimit, one node-wide setting (the CI cluster's is 1024 per pod)"
        )
    unlimited = await adapter.create(oa.SandboxSpec(ttl=300))
    try:
        _, out = await run(unlimited, FORK_BOMB)
        assert reported(out, "BOMB") == 64, f"proof: without a limit the bomb starts 64 processes: {out}"
    finally:
        await unlimited.close()
    box = await adapter.create(oa.SandboxSpec(ttl=300, pids=16))
    try:
        _, out = await run(box, FORK_BOMB)
        # spec.pids bounds the processes commands start; the adapter's own few come on top.
        assert reported(out, "BOMB") <= 16, f"the sandbox exceeded pids=16: {out}"
        # The bomb is over and its sleeps are gone: the sandbox works again.
        with anyio.fail_after(60):
            while True:
                after = await box.exec("echo usable", timeout=10)
                if after.ok or after.reason is oa.ExitReason.SANDBOX_LOST:
                    break
                await anyio.sleep(0.5)
        assert after.text == "usable\n", after
    finally:
        await box.close()


def disk_usage(path: str) -> int:
    """Bytes of disk the files under path hold (sparse holes count nothing)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


SPOOL_LIMIT = 8 * 2**20  # "a few MiB": the cap (1 MiB by default) plus what is in flight


@pytest.mark.soak  # long: the default run leaves it to `pytest -m soak` (CI runs both)
async def test_huge_output_is_capped_and_never_spooled(make_adapter: Callable[..., oa.Adapter]) -> None:
    """2 GB on stdout: the result is capped (head, tail, the count of what was cut) and the
    sandbox's spool holds no more than a few MiB at any time. The command measures its own
    spool halfway (a later command could not: it starts with a fresh spool); for local the
    test also watches the sandbox's dir from the host for the whole run."""
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=600))
    half = 1_000_000_000
    peak = 0
    watching = adapter.name == "local"  # the sandbox's dir is a host path
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, disk_usage(f"{adapter.root}/{box.id}"))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        if watching:
            watcher.start()
        script = (
            f"head -c {half} /dev/zero; du -sk {quote(box.spool_dir)} >&2; head -c {half} /dev/zero; echo tail-marker"
        )
        result = await box.exec(script, timeout=300)
        stop.set()
        if watching:
            watcher.join(10)
        assert result.ok, result
        kept = len(result.stdout) - len(oa_cut_marker(result))
        assert result.stdout_cut == 2 * half + len("tail-marker\n") - kept
        assert len(result.stdout) < 2 * 2**20 and result.stdout.endswith(b"tail-marker\n")
        halfway_kib = int(result.stderr.split()[0])
        assert halfway_kib * 1024 <= SPOOL_LIMIT, f"halfway, the spool held {halfway_kib} KiB"
        assert peak <= SPOOL_LIMIT, f"the sandbox dir held {peak / 2**20:.0f} MiB while the command ran"
    finally:
        stop.set()
        await box.close()


def oa_cut_marker(result: oa.ExecResult) -> bytes:
    from orchard_async.kit.shell import cut_marker

    return cut_marker(result.stdout_cut)


if sys.platform != "linux":  # pragma: no cover - the suite's probes read Linux /proc
    pytestmark = pytest.mark.skip(reason="the attack suite needs Linux")

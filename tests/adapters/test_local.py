"""Local-adapter specifics: isolation, limits, and nothing left behind even after SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async.adapters import local_isolation as iso
from orchard_async.adapters.local import SANDBOX_ENV, LocalAdapter, _sandbox_processes
from tests.conftest import backend_missing

SEEN: set[str] = set()  # ids of sandboxes these tests created (teammates' runs may share the host)


def leftovers(root: Path) -> tuple[list[str], list[str]]:
    """Sandbox dirs under root, and ids of this root's sandboxes that still have processes
    or a pids cgroup."""
    dirs = sorted(p.name for p in root.iterdir()) if root.exists() else []
    SEEN.update(dirs)
    busy = {Path(d).name for d in _sandbox_processes() if Path(d).name in SEEN}
    cgroup_parent, _ = iso.pids_cgroup_parent()
    if cgroup_parent:
        busy |= {name for name in os.listdir(cgroup_parent) if name in SEEN}
    return dirs, sorted(busy)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "sandboxes"


@pytest.fixture(params=["bwrap", "unshare", "none"])
def isolation(request: pytest.FixtureRequest) -> str:
    """Lifecycle holds in every isolation mode."""
    mode = request.param
    if mode != "none" and not iso.probe(mode).ok:
        backend_missing(f"isolation {mode}: {iso.probe(mode).why}")
    return mode


def isolated() -> bool:
    return iso.resolve("auto")[0] != "none"


async def test_close_removes_dir_and_every_process(root: Path, isolation: str) -> None:
    adapter = LocalAdapter(root=root, isolation=isolation)
    box = await adapter.create(oa.SandboxSpec(ttl=60, pids=64))
    await box.exec("sleep 300 >/dev/null 2>&1 &  (sleep 301 &) ; true")
    assert leftovers(root) == ([box.id], [box.id])
    await box.close()
    assert leftovers(root) == ([], [])


async def test_a_shell_that_fails_to_start_is_reported_with_its_error(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The launcher removes the sandbox dir (its log too) when what it starts exits at once;
    # the error must still reach the caller, and nothing may stay behind.
    monkeypatch.setattr(iso, "LAUNCHER", "echo 'mount: permission denied' >&2; rm -rf -- \"$1\"; exit 3")
    adapter = LocalAdapter(root=root, isolation="none")
    with pytest.raises(oa.CreateFailed, match=r"exit 3\).*mount: permission denied"):
        await adapter.create(oa.SandboxSpec(ttl=60))
    assert leftovers(root) == ([], [])


@pytest.mark.skipif(not isolated(), reason="no isolation here")
async def test_network_off_blocks_connections_and_on_allows_them(root: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    probe = f'{sys.executable} -c \'import socket; socket.create_connection(("127.0.0.1", {port}), timeout=2); print("connected")\''
    adapter = LocalAdapter(root=root)
    try:
        off = await adapter.create(oa.SandboxSpec(ttl=60))
        blocked = await off.exec(probe, timeout=20)
        assert blocked.exit_code != 0 and b"connected" not in blocked.stdout
        on = await adapter.create(oa.SandboxSpec(ttl=60, network="on"))
        allowed = await on.exec(probe, timeout=20)
        assert allowed.text.strip() == "connected", allowed.error_text
    finally:
        listener.close()
        await adapter.close()


@pytest.mark.skipif(not isolated(), reason="no isolation here")
async def test_pid_namespace_hides_host_processes(root: Path) -> None:
    adapter = LocalAdapter(root=root)
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    try:
        result = await box.exec("ls /proc | grep -c '^[0-9]'")
        assert int(result.text) < 10  # the shell, this command and little else
    finally:
        await adapter.close()


async def test_memory_limit_applies(root: Path, isolation: str) -> None:
    adapter = LocalAdapter(root=root, isolation=isolation)
    box = await adapter.create(oa.SandboxSpec(ttl=60, memory="200Mi"))
    try:
        over = await box.exec(f"{sys.executable} -c 'x = bytearray(400 * 2**20)'", timeout=30)
        assert over.reason is oa.ExitReason.NONZERO and b"MemoryError" in over.stderr
        under = await box.exec(f"{sys.executable} -c 'x = bytearray(20 * 2**20)'", timeout=30)
        assert under.ok, under.error_text
    finally:
        await adapter.close()


async def test_environment_is_clean_and_spec_env_is_set(
    root: Path, isolation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "secret-from-the-controller")
    adapter = LocalAdapter(root=root, isolation=isolation)
    box = await adapter.create(oa.SandboxSpec(ttl=60, env={"TASK_MODE": "eval"}))
    try:
        env = dict(line.split("=", 1) for line in (await box.exec("env -0")).stdout.decode().split("\0") if line)
        env.pop("PWD", None)  # the shell's own
        env.pop("OLDPWD", None)
        assert env == {
            "PATH": f"{root / box.id / 'bin'}:{iso.SYSTEM_PATH}",
            "HOME": box.workdir,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "TASK_MODE": "eval",
            SANDBOX_ENV: str(root / box.id),
        }
    finally:
        await adapter.close()


@pytest.mark.parametrize("walled", ["bwrap", "unshare"])
async def test_file_operations_reach_what_commands_reach_and_no_more(root: Path, walled: str) -> None:
    """The file API runs as the sandbox's commands do: it reads what they can read (the host's
    root, read-only), writes only where they can, and sees neither another sandbox nor the host
    paths the boundary hides. (Without isolation it is the caller's own file access.)"""
    if not iso.probe(walled).ok:
        backend_missing(f"isolation {walled}: {iso.probe(walled).why}")
    adapter = LocalAdapter(root=root, isolation=walled)
    other = await adapter.create(oa.SandboxSpec(ttl=60))
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    try:
        await other.write_file("secret.txt", "other's")
        passwd = await anyio.Path("/etc/passwd").read_bytes()
        assert (await box.read_file("/etc/passwd")) == passwd
        assert "etc" in {entry.name for entry in await box.list_dir("/")}
        for path in ("../../escape", "/etc/orchard-escape", "a/../../../x"):
            with pytest.raises(OSError, match="Read-only file system"):
                await box.write_file(path, "x")
        assert not await anyio.Path("/escape").exists() and not await anyio.Path("/etc/orchard-escape").exists()
        with pytest.raises(FileNotFoundError):
            await box.read_file(f"{root / other.id}/work/secret.txt")
        await box.write_file("/tmp/scratch/x", "mine")  # its private /tmp
        assert await box.read_file("/tmp/scratch/x") == b"mine"
    finally:
        await adapter.close()


async def test_ttl_watchdog_ends_a_forgotten_sandbox(root: Path, isolation: str) -> None:
    adapter = LocalAdapter(root=root, isolation=isolation)
    box = await adapter.create(oa.SandboxSpec(ttl=1, pids=64))
    await box.exec("sleep 300 >/dev/null 2>&1 &")
    wait_for(lambda: leftovers(root) == ([], []), 15, "the TTL watchdog")
    assert (await box.exec("true")).reason is oa.ExitReason.SANDBOX_LOST
    await adapter.close()


CONTROLLER = textwrap.dedent(
    """
    import sys, anyio
    import orchard_async as oa
    from orchard_async.adapters.local import LocalAdapter

    async def main():
        adapter = LocalAdapter(root=sys.argv[1], isolation=sys.argv[3])
        boxes = [await adapter.create(oa.SandboxSpec(ttl=float(sys.argv[2]), pids=64)) for _ in range(3)]
        for box in boxes:
            await box.exec("sleep 300 >/dev/null 2>&1 &")
        print("ready", flush=True)
        await anyio.sleep(3600)

    anyio.run(main)
    """
)


def start_controller(root: Path, ttl: float, isolation: str) -> subprocess.Popen:
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(root), str(ttl), isolation], stdout=subprocess.PIPE, text=True
    )
    assert controller.stdout is not None and controller.stdout.readline().strip() == "ready"
    assert len(leftovers(root)[0]) == 3
    return controller


def test_sigkilled_controller_leaves_nothing(root: Path, isolation: str) -> None:
    controller = start_controller(root, ttl=600, isolation=isolation)
    os.kill(controller.pid, signal.SIGKILL)
    controller.wait()
    # The shells see EOF on their pipes and end themselves, taking their processes along.
    wait_for(lambda: leftovers(root) == ([], []), SELF_DESTRUCT, "sandboxes of a killed controller to end")


# What the README promises: a dead controller's local sandboxes are gone within 2 s.
SELF_DESTRUCT = 2.0

DIES_MID_CREATE = textwrap.dedent(
    """
    import os, signal, sys, anyio
    import orchard_async as oa
    from orchard_async.adapters.local import LocalAdapter

    class DiesWhileMakingTheDirectory(LocalAdapter):
        def _prepare_dirs(self, base, *made):
            super()._prepare_dirs(base, *made)
            os.kill(os.getpid(), signal.SIGKILL)

    anyio.run(lambda: DiesWhileMakingTheDirectory(root=sys.argv[1], isolation=sys.argv[2]).create(oa.SandboxSpec(pids=64)))
    """
)


def test_a_controller_killed_while_it_makes_a_sandbox_leaves_nothing(root: Path, isolation: str) -> None:
    """Killed after the sandbox's directory exists, before its shell runs: the gate the
    controller started first sees EOF and removes the directory."""
    controller = subprocess.run([sys.executable, "-c", DIES_MID_CREATE, str(root), isolation], check=False)
    assert controller.returncode == -signal.SIGKILL
    wait_for(lambda: leftovers(root) == ([], []), SELF_DESTRUCT, "the half-made sandbox to go")


def test_reap_removes_sandboxes_of_dead_runs_at_once(root: Path, isolation: str) -> None:
    controller = start_controller(root, ttl=600, isolation=isolation)
    dirs, _ = leftovers(root)
    # Freeze the sandboxes' shells so they cannot clean up after themselves; reap must.
    frozen = [pid for sdir, pids in _sandbox_processes().items() if Path(sdir).name in dirs for pid in pids]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    os.kill(controller.pid, signal.SIGKILL)
    controller.wait()
    try:
        removed = oa.run(lambda: LocalAdapter(root=root).reap())
        assert sorted(removed) == dirs
        assert leftovers(root) == ([], [])
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def test_reap_leaves_live_runs_alone(root: Path, isolation: str) -> None:
    controller = start_controller(root, ttl=600, isolation=isolation)
    try:
        assert oa.run(lambda: LocalAdapter(root=root).reap()) == []
        assert len(leftovers(root)[0]) == 3
    finally:
        controller.kill()
        controller.wait()
    wait_for(lambda: leftovers(root) == ([], []), 15, "cleanup")

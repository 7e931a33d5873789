"""How a closed local sandbox's processes are ended: through its PID namespace's init where it
has one (no scan of the host's processes), else by one shared scan a round for every sandbox
being closed at the time (the abort storm of tests/core/test_control.py is the load case)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async.adapters import local_isolation as iso
from orchard_async.adapters import local_reap
from orchard_async.adapters.local import DESTROY_GRACE, LocalAdapter
from orchard_async.adapters.local_reap import SANDBOX_ENV, Sweeper, _marker_value, _sandbox_processes
from tests.conftest import backend_missing


def test_the_marker_is_a_whole_entry_of_the_environment() -> None:
    assert _marker_value(b"ORCHARD_SANDBOX=/r/a\0PATH=/bin\0") == b"/r/a"
    assert _marker_value(b"PATH=/bin\0ORCHARD_SANDBOX=/r/b\0HOME=/\0") == b"/r/b"
    assert _marker_value(b"PATH=/bin\0ORCHARD_SANDBOX=/r/c") == b"/r/c"  # last entry, no NUL after it
    assert _marker_value(b"X_ORCHARD_SANDBOX=/r/d\0PATH=/bin\0") is None
    assert _marker_value(b"A=ORCHARD_SANDBOX=/r/e\0") is None
    assert _marker_value(b"ORCHARD_SANDBOX=/r/f\0ORCHARD_SANDBOX=/r/g\0") == b"/r/f"  # the first, as getenv


async def test_concurrent_sweeps_share_their_scans(tmp_path: Path) -> None:
    """Sixteen sandboxes' processes (a parent and an orphaned child each) killed by sixteen
    sweeps at once: all gone, in a few rounds of one scan each (a scan per sweep a round made
    256 aborted episodes' closes take 256 scans a round)."""
    dirs = [str(tmp_path / f"lo-{n}") for n in range(16)]
    started = start_marked(dirs)
    try:
        with anyio.fail_after(30):
            while sum(len(_sandbox_processes().get(d, [])) for d in dirs) < 2 * len(dirs):  # noqa: ASYNC110 - polls /proc
                await anyio.sleep(0.02)
        sweeper = Sweeper()
        async with anyio.create_task_group() as group:
            for d in dirs:
                group.start_soon(sweeper.sweep, {d})
        assert not [d for d in dirs if _sandbox_processes().get(d)]
        assert sweeper.scans <= 8, f"{sweeper.scans} scans for {len(dirs)} sweeps"
    finally:
        for process in started:
            process.kill()
            process.wait()


def start_marked(dirs: list[str]) -> list[subprocess.Popen]:
    """A process per dir, carrying its marker, with a child it leaves behind when killed."""
    return [
        subprocess.Popen(
            ["sh", "-c", "sleep 60 & exec sleep 61"], env={**os.environ, SANDBOX_ENV: d}, start_new_session=True
        )
        for d in dirs
    ]


async def test_a_sweep_is_judged_only_by_a_scan_begun_after_it_asked(tmp_path: Path) -> None:
    """A sweep asked for while a round's scan runs waits for the next round: that scan may
    have listed the processes before the sandbox's were there to be seen."""
    late = str(tmp_path / "lo-late")
    calls: list[frozenset[str]] = []
    first_scan_running, release = anyio.Event(), anyio.Event()

    def kill_found(dirs: frozenset[str]) -> set[str]:
        calls.append(dirs)
        if len(calls) == 1:
            anyio.from_thread.run_sync(first_scan_running.set)
            anyio.from_thread.run(release.wait)
        return set()

    sweeper = Sweeper()
    original = local_reap._kill_found
    local_reap._kill_found = kill_found
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(sweeper.sweep, {str(tmp_path / "lo-early")})
            await first_scan_running.wait()
            group.start_soon(sweeper.sweep, {late})
            await anyio.sleep(0.05)
            release.set()
    finally:
        local_reap._kill_found = original
    assert len(calls) == 2 and late not in calls[0] and late in calls[1]


@pytest.mark.parametrize("walled", ["bwrap", "unshare"])
async def test_a_walled_sandbox_closes_mid_command_without_a_scan(
    root: Path, walled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a PID namespace, close kills its init (the kernel ends the rest, and lets the init
    finish only after them) and waits on its pidfd: no scan of the host's processes, and no
    wait for the running command to end (close used to wait DESTROY_GRACE out)."""
    if not iso.probe(walled).ok:
        backend_missing(f"isolation {walled}: {iso.probe(walled).why}")
    adapter = LocalAdapter(root=root, isolation=walled)
    box = await adapter.create(oa.SandboxSpec(ttl=60, pids=64))
    await box.exec("sleep 300 >/dev/null 2>&1 &  (sleep 301 &) ; true")
    base = str(root / box.id)
    assert len(_sandbox_processes()[base]) >= 2
    scans: list[frozenset[str]] = []
    monkeypatch.setattr(local_reap, "_kill_found", lambda dirs: scans.append(dirs) or set())
    results: list[oa.ExecResult] = []

    async def busy() -> None:
        results.append(await box.exec("sleep 60"))

    async with anyio.create_task_group() as group:
        group.start_soon(busy)
        await anyio.sleep(0.3)
        started = time.monotonic()
        await box.close()
        closed_in = time.monotonic() - started
    assert not scans, "a sandbox with a PID namespace was closed by scanning /proc"
    assert closed_in < DESTROY_GRACE, closed_in
    assert results and results[0].reason is oa.ExitReason.SANDBOX_LOST
    assert nothing_left(base), "close returned before the sandbox's processes and dir were gone"


def nothing_left(base: str) -> bool:
    return not _sandbox_processes().get(base) and not Path(base).exists()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "sandboxes"

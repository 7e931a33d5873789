"""Every line `orchard-async doctor` prints about the local adapter, held to by a test here
(or, where named, in tests/conformance/test_attacks.py and tests/adapters/test_local.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async.adapters import local_isolation as iso
from orchard_async.adapters.local import LocalAdapter, _sandbox_processes, isolation_report
from tests.conftest import backend_missing

NAMESPACES = ("user", "pid", "mnt", "ipc", "uts", "net", "cgroup")


@pytest.fixture(params=["bwrap", "unshare"])
def mode(request: pytest.FixtureRequest) -> str:
    if not iso.probe(request.param).ok:
        backend_missing(f"isolation {request.param}: {iso.probe(request.param).why}")
    return request.param


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The controller's home, with a secret in it."""
    path = tmp_path / "home"
    path.mkdir()
    (path / "secret.txt").write_text("home-secret")
    monkeypatch.setenv("HOME", str(path))
    return path


@pytest.fixture
async def adapter(mode: str, tmp_path: Path, home: Path) -> AsyncIterator[LocalAdapter]:
    made = LocalAdapter(root=tmp_path / "sandboxes", isolation=mode)
    yield made
    await made.close()


def read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def comm(pid: int) -> str:
    return read(f"/proc/{pid}/comm").strip()


def host_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def host_dir(adapter: LocalAdapter, box: oa.Sandbox) -> str:
    """The sandbox's dir on the host (it sees its work dir at /workspace)."""
    return str(adapter.root / box.id)


def test_report_names_the_mode_and_every_limit(mode: str) -> None:
    report = isolation_report(mode)
    assert report["isolation"].startswith(f"{mode}: own user, PID, mount, IPC, UTS and network namespaces")
    assert set(report) == {
        "interpreter",
        "isolation",
        "user",
        "filesystem",
        "processes",
        "environment",
        "network",
        "output",
        "pids",
        "memory",
        "cpu",
    }


async def test_own_namespaces_per_sandbox(adapter: LocalAdapter) -> None:
    """doctor: 'own user, PID, mount, IPC, UTS and network namespaces per sandbox'."""
    boxes = [await adapter.create(oa.SandboxSpec(ttl=60)) for _ in range(2)]
    script = " ".join(f"readlink /proc/self/ns/{name};" for name in NAMESPACES)
    seen = [(await box.exec(script)).text.split() for box in boxes]
    host = [os.readlink(f"/proc/self/ns/{name}") for name in NAMESPACES]
    for inside in seen:
        assert len(inside) == len(NAMESPACES)
        shared = [name for name, a, b in zip(NAMESPACES, inside, host, strict=True) if a == b]
        assert not shared, f"namespaces shared with the host: {shared}"
    shared = [name for name, a, b in zip(NAMESPACES, *seen, strict=True) if a == b]
    assert not shared, f"namespaces shared between sandboxes: {shared}"
    on = await adapter.create(oa.SandboxSpec(ttl=60, network="on"))
    net = (await on.exec("readlink /proc/self/ns/net")).text.strip()
    assert net == os.readlink("/proc/self/ns/net"), "network='on' shares the host's network"


async def test_commands_run_unprivileged_without_capabilities(adapter: LocalAdapter) -> None:
    """doctor: 'commands run as nobody (65534) / your uid, with no capabilities and no-new-privileges'."""
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    inside = dict(
        line.split(":\t", 1) for line in (await box.exec("cat /proc/self/status")).text.splitlines() if ":\t" in line
    )
    for field in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(inside[field], 16) == 0, f"{field} = {inside[field]}"
    assert inside["NoNewPrivs"].strip() == "1"
    # The host's view: the process really is that user (not root mapped to a name).
    await box.exec("sleep 30 >/dev/null 2>&1 &")
    # The shell answers before its background child has exec'd sleep (its comm is the shell's
    # until then): look again for a few seconds, as a loaded machine may take that long.
    for _ in range(100):  # 5 s at most
        sleeps = [pid for pid in _sandbox_processes().get(host_dir(adapter, box), []) if comm(pid) == "sleep"]
        if sleeps:
            break
        await anyio.sleep(0.05)
    assert sleeps, "the sandbox's sleep is not visible from the host"
    uid, gid = iso.sandbox_ids()
    for pid in sleeps:
        status = host_status(pid)
        assert status["Uid"].split() == [str(uid)] * 4 and status["Gid"].split() == [str(gid)] * 4
        if iso.is_root():
            assert status["Groups"] in ("", str(gid)), "root's supplementary groups leaked in"
    assert "your uid" in isolation_report(adapter.isolation)["user"] or iso.is_root()


async def test_home_root_and_other_sandboxes_are_hidden(adapter: LocalAdapter, home: Path) -> None:
    """doctor: 'your home, /root and other sandboxes hidden (the interpreter's dirs excepted,
    read-only)'; writes are covered by test_attacks."""
    other = await adapter.create(oa.SandboxSpec(ttl=60))
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    home_view = await box.exec(f"ls -A {home}; cat {home}/secret.txt")
    assert home_view.stdout == b"" and b"home-secret" not in home_view.stdout
    assert (await box.exec(f"ls -A {adapter.root}")).text.split() == [box.id], "other sandboxes are visible"
    allowed = {a for d in iso.python_dirs() for a in [*iso.ancestors(d), d]}  # the way to the interpreter
    homes = (await box.exec("ls -A /home")).text.split()  # other users' homes, often world-readable
    assert {f"/home/{name}" for name in homes} <= allowed, f"/home shows {homes}"
    assert (await box.exec(f"ls {host_dir(adapter, other)}/work")).exit_code != 0
    # /root shows nothing but the way to the interpreter's dirs.
    listing = await box.exec("find /root -mindepth 1 -maxdepth 4")
    strays = [p for p in listing.text.split() if p not in allowed and not any(iso.under(p, d) for d in allowed)]
    assert not strays, f"visible under /root: {strays[:5]}"


async def test_interpreter_is_the_controllers_with_pytest(adapter: LocalAdapter) -> None:
    """doctor: '<sys.executable> as python and python3 (pytest <version>)'."""
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    for name in ("python", "python3"):
        result = await box.exec(f"{name} -c 'import sys, pytest; print(sys.executable); print(pytest.__version__)'")
        assert result.ok, result.error_text
        assert result.text.split() == [sys.executable, iso.interpreter()[1]]
    shim_dir = (await box.exec("dirname $(command -v python)")).text.strip()
    assert shim_dir == f"{host_dir(adapter, box)}/bin" and not iso.under(shim_dir, box.workdir)
    assert (await box.exec(f"touch {shim_dir}/x")).exit_code != 0, "the interpreter's dir must be read-only"
    assert isolation_report(adapter.isolation)["interpreter"].startswith(f"{sys.executable} as python and python3")


async def test_processes_see_only_their_own(adapter: LocalAdapter) -> None:
    """doctor: 'the sandbox sees only its own (own /proc)'; ending them all is test_local's."""
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    pids = (await box.exec("ls /proc | grep '^[0-9]'")).text.split()
    assert len(pids) < 10, pids
    listing = await box.exec("for f in /proc/[0-9]*/cmdline; do cat $f; echo; done")
    assert read("/proc/self/cmdline").encode() not in listing.stdout.split(b"\n"), "the controller is visible"


async def test_pids_cgroup_limits_each_sandbox(adapter: LocalAdapter) -> None:
    """doctor (where a cgroup is writable): 'pids cgroup per sandbox (pids.max = spec.pids + N)'."""
    parent, why = iso.pids_cgroup_parent()
    if not parent:
        pytest.skip(f"no writable pids cgroup here ({why}); the RLIMIT_NPROC test covers this host")
    assert isolation_report(adapter.isolation)["pids"].startswith("pids cgroup per sandbox")
    box = await adapter.create(oa.SandboxSpec(ttl=60, pids=16))
    cgroup = os.path.join(parent, box.id)
    assert read(f"{cgroup}/pids.max").strip() == str(16 + iso.ADAPTER_PROCESSES)
    await box.exec("sleep 30 >/dev/null 2>&1 &")
    # Asked of each process (/proc/PID/cgroup), not of a cgroup.procs snapshot taken apart
    # from the process scan: a process gone in between ("") is not one outside.
    mount, _ = iso._own_cgroup("pids") or ("", "")
    inside = cgroup.removeprefix(mount)
    launcher = set(launcher_pids(host_dir(adapter, box)))
    outside = {
        pid: (where, read(f"/proc/{pid}/cmdline").replace("\0", " ")[:200])
        for pid in _sandbox_processes()[host_dir(adapter, box)]
        if pid not in launcher and (where := pids_cgroup_of(pid)) not in ("", inside)
    }
    assert not outside, f"sandbox processes outside {inside}: {outside}"
    await box.close()
    assert read(f"{cgroup}/pids.max") == "", "the sandbox's cgroup outlived it"


def pids_cgroup_of(pid: int) -> str:
    """A process's pids cgroup (v1 line, else the v2 one), or '' when it is gone."""
    lines = read(f"/proc/{pid}/cgroup").splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return path
    return next((line[3:] for line in lines if line.startswith("0::")), "")


def launcher_pids(base: str) -> list[int]:
    """The launcher is the sandbox's host-side parent: it carries the marker, outside the cgroup
    (a process gone since the scan, a command's own say, reads as "")."""
    return [pid for pid in _sandbox_processes().get(base, []) if "launcher" in read(f"/proc/{pid}/cmdline")]


@pytest.fixture
def no_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(iso, "pids_cgroup_parent", lambda: ("", "no cgroup, for this test"))


@pytest.fixture
def same_user_processes() -> Iterator[int]:
    """40 processes of the sandboxes' host user that belong to no sandbox (the issue: 20 of
    them starved a pids=16 sandbox when the limit was RLIMIT_NPROC per user)."""
    uid, gid = iso.sandbox_ids()
    prefix = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"] if iso.is_root() else []
    crowd = [subprocess.Popen([*prefix, "sleep", "120"]) for _ in range(40)]
    try:
        yield len(crowd)
    finally:
        for process in crowd:
            process.kill()
            process.wait()


STARTS = """
rm -f started.pids
sh -c 'i=0; while [ $i -lt {n} ]; do sleep 60 & echo $! >>started.pids; i=$((i+1)); done' 2>/dev/null
alive=0; while read -r p; do if kill -0 "$p" 2>/dev/null; then alive=$((alive+1)); kill "$p"; fi; done <started.pids
echo $alive
"""


@pytest.mark.usefixtures("no_cgroup")
async def test_without_a_cgroup_rlimit_nproc_is_per_sandbox(adapter: LocalAdapter, same_user_processes: int) -> None:
    """doctor (where no cgroup is writable): 'RLIMIT_NPROC inside the sandbox's own user
    namespace, counted per sandbox'."""
    if not iso.per_namespace_nproc():
        pytest.skip("this kernel counts RLIMIT_NPROC per user (before 5.14): doctor says pids is not enforced")
    if iso.is_root() and not adapter._probe.user_namespace:
        pytest.skip("root without user namespaces here: doctor says pids is not enforced")
    assert "RLIMIT_NPROC inside the sandbox's own user namespace" in isolation_report(adapter.isolation)["pids"]
    box = await adapter.create(oa.SandboxSpec(ttl=60, pids=16))
    # Unrelated processes of the same host user do not count against the sandbox...
    assert int((await box.exec(STARTS.format(n=8))).text) == 8
    # ...and the sandbox's own cannot pass its limit.
    assert int((await box.exec(STARTS.format(n=64))).text) <= 16
    assert (await box.exec("echo usable")).text == "usable\n"


async def test_memory_is_rlimit_as(adapter: LocalAdapter) -> None:
    """doctor: 'RLIMIT_AS (address space, per process) from spec.memory' (the allocation
    test is test_local's test_memory_limit_applies)."""
    box = await adapter.create(oa.SandboxSpec(ttl=60, memory="200Mi"))
    assert (await box.exec("ulimit -v")).text.strip() == str(200 * 1024)
    assert isolation_report(adapter.isolation)["memory"].startswith("RLIMIT_AS")


# -- where no isolation works -----------------------------------------------------------------


@pytest.fixture
def nothing_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(iso, "probe", lambda mode: iso.Probe(False, f"{mode}: unavailable in this test"))


@pytest.mark.usefixtures("nothing_works")
async def test_without_isolation_a_sandbox_without_network_is_refused(tmp_path: Path) -> None:
    report = isolation_report()
    assert report["isolation"].startswith("NONE (bwrap: unavailable in this test; unshare: unavailable in this test)")
    assert report["pids"].startswith("not enforced")
    adapter = LocalAdapter(root=tmp_path / "sandboxes")
    try:
        with pytest.raises(oa.ConfigError) as refused:
            await adapter.create(oa.SandboxSpec(ttl=60))
        assert "\n" not in str(refused.value) and "isolation='none'" in str(refused.value)
        assert not (tmp_path / "sandboxes").exists() or not list((tmp_path / "sandboxes").iterdir())
        on = await adapter.create(oa.SandboxSpec(ttl=60, network="on"))  # asks for no wall it lacks
        assert (await on.exec("echo hi")).text == "hi\n"
    finally:
        await adapter.close()


@pytest.mark.usefixtures("nothing_works")
async def test_isolation_none_by_name_runs_without_walls(tmp_path: Path) -> None:
    adapter = LocalAdapter(root=tmp_path / "sandboxes", isolation="none")
    try:
        box = await adapter.create(oa.SandboxSpec(ttl=60))
        assert (await box.exec("readlink /proc/self/ns/pid")).text.strip() == os.readlink("/proc/self/ns/pid")
        # No mount namespace: the work dir is its host path, and writable_dirs cannot be made.
        assert "no /workspace" in isolation_report("none")["filesystem"]
        assert box.workdir == host_dir(adapter, box) + "/work" and (await box.exec("pwd")).text.strip() == box.workdir
        with pytest.raises(oa.ConfigError, match="writable_dirs"):
            await adapter.create(oa.SandboxSpec(ttl=60, writable_dirs=("/app",)))
    finally:
        await adapter.close()


@pytest.mark.usefixtures("nothing_works")
def test_a_mode_that_does_not_work_here_is_a_config_error(tmp_path: Path) -> None:
    for mode in ("bwrap", "unshare"):
        with pytest.raises(oa.ConfigError, match=f"isolation='{mode}' does not work here"):
            LocalAdapter(root=tmp_path, isolation=mode)
    with pytest.raises(oa.ConfigError, match="isolation must be one of"):
        LocalAdapter(root=tmp_path, isolation="chroot")


async def test_work_dir_at_workspace_and_writable_dirs_bound_from_the_sandbox_dir(adapter: LocalAdapter) -> None:
    """doctor: 'writable: the sandbox's work dir (at /workspace, the default cwd), spec.writable_dirs'.
    The dirs live in the sandbox's own dir on the host (gone with it); one the mounts cannot
    make is refused in one line before anything starts."""
    assert "/workspace" in isolation_report(adapter.isolation)["filesystem"]
    box = await adapter.create(oa.SandboxSpec(ttl=60, writable_dirs=("/app", "/tmp/made/here")))
    assert (await box.exec("echo a >/app/f && echo w >/workspace/f && echo t >/tmp/made/here/f")).ok
    base = Path(host_dir(adapter, box))
    assert (base / "work" / "f").read_text() == "w\n"
    assert sorted(p.read_text() for p in (base / "dirs").glob("*/**/f")) == ["a\n", "t\n"]
    await box.close()
    assert not await anyio.Path(base).exists()
    for refused in ("/usr/share/orchard-new", "/proc/x", str(adapter.root)):
        with pytest.raises(oa.ConfigError, match="writable_dirs") as why:
            await adapter.create(oa.SandboxSpec(ttl=60, writable_dirs=(refused,)))
        assert "\n" not in str(why.value)
    assert await adapter.list_owned() == [] and not list(adapter.root.iterdir())

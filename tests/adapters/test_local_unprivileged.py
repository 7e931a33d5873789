"""The local adapter's walls as a non-root caller builds them (the normal laptop case), run
from a root test process as a regular user of the machine: the sandbox command the adapter
would build for that user, with the same attacks as the conformance suite, minus python
(that user cannot read the test's interpreter under /root)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard_async.adapters import local_isolation as iso
from tests.conftest import backend_missing

ATTACKS = r"""
echo "uid $(id -u)"
grep -E '^(CapPrm|CapEff|NoNewPrivs):' /proc/self/status | tr -d ' \t'
cat /etc/shadow >/dev/null 2>&1 && echo SHADOW-READ
for d in /etc /usr /var/tmp /home /root "$ORCHARD_SANDBOX"; do (echo x >"$d/pwned") 2>/dev/null && echo "WROTE $d"; done
(echo ok >work-file) && echo WORK-WRITABLE
echo "processes $(ls /proc | grep -c '^[0-9]')"
umount -l /proc 2>/dev/null && echo UNMOUNTED
nsenter -t 1 -n -m true 2>/dev/null && echo ENTERED
echo "interfaces $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')"
ls -A /home | sed 's/^/HOME-ENTRY /'
ulimit -p 22
sh -c 'i=0; while [ $i -lt 64 ]; do sleep 30 & echo $! >>bomb.pids; i=$((i+1)); done' 2>/dev/null
n=0; while read -r p; do if kill -0 "$p" 2>/dev/null; then n=$((n+1)); kill "$p"; fi; done <bomb.pids
echo "bomb $n"
"""


def regular_user() -> pwd.struct_passwd | None:
    for entry in pwd.getpwall():
        if 1000 <= entry.pw_uid < 60000:
            return entry
    return None


@pytest.fixture
def user(monkeypatch: pytest.MonkeyPatch) -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("runs as root, to act as another user; as a non-root user the whole suite is this case")
    found = regular_user()
    if found is None:
        pytest.skip("this machine has no regular user (uid 1000-59999) to run the sandbox as")
    monkeypatch.setattr(iso, "is_root", lambda: False)
    monkeypatch.setattr(iso, "sandbox_ids", lambda: (found.pw_uid, found.pw_gid))
    monkeypatch.setattr(iso, "python_dirs", lambda: ())
    monkeypatch.setenv("HOME", found.pw_dir)
    return found


@pytest.fixture
def root_dir() -> Iterator[Path]:
    """A sandbox root the user can reach (pytest's own tmp dirs are root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="orchard-unprivileged-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("mode", ["bwrap", "unshare"])
def test_a_non_root_callers_sandbox_holds(mode: str, user: pwd.struct_passwd, root_dir: Path) -> None:
    if shutil.which("bwrap" if mode == "bwrap" else "unshare") is None:
        backend_missing(f"{mode} is not installed")
    base = root_dir / "lo-test"
    for name in ("work", "ctl"):
        (base / name).mkdir(parents=True)
    for path in (root_dir, base, base / "work", base / "ctl"):
        os.chown(path, user.pw_uid, user.pw_gid)
    inner = iso.sandbox_argv(mode, iso.layout(root_dir, base, network=False), user_namespace=True)
    argv = ["sh", "-c", iso.LAUNCHER, "launcher", str(base), "", mode, *inner, "sh", "-c", ATTACKS]
    as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    # Processes of the same user outside the sandbox must not count against its limit.
    crowd = [subprocess.Popen([*as_user, "sleep", "120"]) for _ in range(30)]
    try:
        done = subprocess.run(
            [*as_user, *argv],
            cwd=base / "work",
            env={"PATH": iso.SYSTEM_PATH, "HOME": str(base / "work"), "ORCHARD_SANDBOX": str(base)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for process in crowd:
            process.kill()
            process.wait()
    lines = done.stdout.splitlines()
    assert f"uid {user.pw_uid}" in lines, (done.stdout, done.stderr)
    assert {"CapPrm:0000000000000000", "CapEff:0000000000000000", "NoNewPrivs:1"} <= set(lines)
    for word in ("SHADOW-READ", "UNMOUNTED", "ENTERED"):
        assert word not in lines, done.stdout
    assert [line for line in lines if line.startswith("WROTE")] == [], done.stdout
    assert "WORK-WRITABLE" in lines
    assert int(next(line for line in lines if line.startswith("processes ")).split()[1]) < 10
    assert "interfaces lo " in lines
    assert not [line for line in lines if line.startswith("HOME-ENTRY")], "/home is visible"
    assert 0 < int(next(line for line in lines if line.startswith("bomb ")).split()[1]) <= 22
    assert not base.exists(), "the launcher left the sandbox's dir behind"
    for target in ("/etc", "/usr", "/var/tmp", "/home", "/root"):
        assert not os.path.exists(f"{target}/pwned")

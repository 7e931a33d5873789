"""How the local adapter walls a sandbox off from the host: namespaces, mounts, users, limits.

Three modes, chosen per adapter (``isolation=``):

* ``bwrap`` (bubblewrap, preferred): one ``bwrap`` call builds the sandbox.
* ``unshare`` (util-linux, the fallback): ``unshare`` makes the namespaces and a small setup
  script (``SETUP``) makes the mounts, then drops every capability.
* ``none``: no walls at all; only for callers that ask for it by name.

Both real modes give each sandbox new user, PID, mount, IPC, UTS (and, unless the spec asks
for network, network) namespaces; the host's root read-only; writable only the sandbox's
``work`` and ``ctl`` dirs and a private ``/tmp``; empty read-only dirs over the user's home,
``/root`` and the adapter root (other sandboxes); a private ``/run`` and ``/dev``; the
sandbox's own ``/proc``; no capabilities and no-new-privileges. The sandbox's processes run
as an unprivileged host user: the caller's own uid when the caller is not root, and
``nobody`` (65534) when it is, so that owner bits of root's files (``/etc/shadow`` is
``root:shadow 640``) grant nothing. Root builds the mounts while still privileged (it can
read paths nobody can), then switches to nobody inside a user namespace of its own.

Limits: ``spec.pids`` is a pids cgroup (``pids.max``) where a cgroup is writable, otherwise
RLIMIT_NPROC set inside the sandbox's own user namespace, which Linux (5.14 and later)
counts per user namespace, so per sandbox; ``spec.memory`` is RLIMIT_AS.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from orchard_async.errors import ConfigError
from orchard_async.kit import procfs

MODES = ("auto", "bwrap", "unshare", "none")
NOBODY = 65534
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Processes of the adapter's own in a sandbox (bwrap or unshare, PID 1, supervisor, server,
# TTL timer and its sleep): a pids limit counts them, so they are added to spec.pids.
ADAPTER_PROCESSES = 6
PER_NAMESPACE_NPROC = (5, 14)  # RLIMIT_NPROC counted per user namespace since Linux 5.14
# Where a sandbox sees its work dir, as in a container: the path Orchard's clients and
# Harbor's tasks name (the work dir is also bound at its host path, where the shell's
# control files live beside it).
WORKSPACE = "/workspace"
# Top-level entries the sandbox gets fresh ones of (its own /proc, /dev, /tmp and /run),
# instead of the host's.
OWN_TOP_LEVEL = ("proc", "dev", "tmp", "run")
# Where spec.writable_dirs may not go: the kernel's views the adapter itself mounts.
NOT_WRITABLE = ("/proc", "/dev", "/sys")

# Host side of every sandbox (`$1` the sandbox dir, `$2` a cgroup dir or "", `$3` "none" when
# the sandbox has no PID namespace to end its processes): joins the cgroup in a child that
# becomes the sandbox, waits for it, then removes what the sandbox leaves behind. It stays
# outside the cgroup so it can remove it. Without a PID namespace, the processes that carry
# the sandbox's marker are killed by hand (a process that dropped the marker escapes that:
# isolation "none" is no boundary), pass after pass until one finds none: a process killed
# in a pass may be one whose parent starts another before its own turn comes (the TTL
# timer, whose sleep killed first is slept again).
LAUNCHER = r"""
base=$1 cg=$2 mode=$3; shift 3
if [ -n "$cg" ]; then (echo 0 >"$cg/cgroup.procs" && exec "$@"); else (exec "$@"); fi
rc=$?
if [ "$mode" = none ]; then
  n=0 found=1
  while [ -n "$found" ] && [ $n -lt 50 ]; do
    found= n=$((n+1))
    for f in $(grep -lzx "ORCHARD_SANDBOX=$base" /proc/[0-9]*/environ 2>/dev/null); do
      p=${f#/proc/}; p=${p%/environ}; if [ "$p" != $$ ]; then kill -KILL "$p" 2>/dev/null && found=1; fi
    done
  done
fi
if [ -d "$base/upper" ]; then umount -l -- "$base/work" 2>/dev/null; fi  # a fork's overlay (local_snapshot)
rm -rf -- "$base" 2>/dev/null
if [ -n "$cg" ]; then
  n=0; until rmdir "$cg" 2>/dev/null || [ $n -ge 50 ]; do sleep 0.1; n=$((n+1)); done
fi
exit $rc
"""

# The unshare mode's mounts, run as root of the new namespaces (`$1` the sandbox dir, `$2`
# "net" when the network is private, `$3` the hidden dirs, `$4` the python dirs to expose, `$5`
# the resolv.conf target to keep, `$6` uid and `$7` gid the sandbox runs as, `$8` "root" when
# the caller is root, `$9` the writable binds, one "SOURCE TARGET" a line, SOURCE relative to
# the sandbox dir, `$10` and `$11` the new root's entries and mount table (root_plan), then
# the command). What is exposed again is opened first (fds 3-9): the
# empty dirs laid over their parents hide their paths, not the open files.
#
# The sandbox's root is a tmpfs of its own (the private /tmp's, made before anything is bound
# into it) holding a read-only recursive bind of every top-level entry of the host's root: a
# new top-level dir such as /workspace needs a writable root to be made in, which the host's,
# read-only, is not. pivot_root then leaves the host's root out of reach.
NEW_ROOT = "/tmp"  # the unshare mode builds the new root in the private /tmp's own tmpfs
SETUP = r"""
set -eu
base=$1 net=$2 hide=$3 expose=$4 resolv=$5 uid=$6 gid=$7 caller=$8 binds=$9 root=${10} table=${11}
shift 11
exec 3<"$base"
if [ -n "$resolv" ]; then exec 9<"$resolv"; fi
n=4; for d in $expose; do eval "exec $n<\"\$d\""; n=$((n+1)); done
# Every host mount read-only, keeping the flags it has (a user namespace may add, not drop).
# One that cannot be made read-only here (an overlay, in a user namespace) is covered by an
# empty read-only dir instead; what was mounted under it is then out of sight as well. One
# that vanished meanwhile (a file another namespace unlinked, e.g. a CNI netns being torn
# down: its mounts go in every namespace) has nothing left to protect.
while read -r _ _ _ _ mp opts _; do
  case "$mp" in *\\*) mp=$(printf '%b' "$mp") ;; esac
  case "$mp" in /proc|/proc/*|/dev/pts|/dev/pts/*) continue ;; esac
  case "$opts" in ro|ro,*) continue ;; esac
  [ -e "$mp" ] || continue
  mount -o "remount,bind,ro${opts#rw}" "$mp" 2>/dev/null || mount -o remount,bind,ro "$mp" 2>/dev/null ||
    mount -t tmpfs -o ro,mode=755,nosuid,nodev tmpfs "$mp" 2>/dev/null || [ ! -e "$mp" ] ||
    { echo "cannot make $mp read-only" >&2; exit 1; }
done </proc/self/mountinfo
# The new root (root_plan): its dirs, files and symlinks, then one `mount -a` of a table of
# its binds and tmpfs mounts, one process for all of them. Binds of read-only mounts are
# read-only, so every entry of the host's is.
r=@NEW_ROOT@
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$r"
nl='
'
tab='	'
dirs=
while IFS= read -r line; do
  case "$line" in
    d\ *) dirs="$dirs${line#d }$nl" ;;
    f\ *) : >"${line#f }" ;;
    l\ *) line=${line#l }; ln -s "${line%%"$tab"*}" "${line#*"$tab"}" ;;
  esac
done <<ROOT
$root
ROOT
IFS=$nl; mkdir -p -- $dirs; unset IFS
printf '%s' "$table" >"$r/.mounts"
mount -a -c -T "$r/.mounts"
rm -f "$r/.mounts"
if [ -n "$resolv" ]; then
  mkdir -p "$r${resolv%/*}" && : >"$r$resolv" && mount -c --bind /proc/self/fd/9 "$r$resolv"
fi
# Binds of read-only mounts are read-only: only work and ctl are made writable again. They
# are bound from the dir opened first, which still reaches what is mounted on them (a fork's
# overlay, see local_snapshot): the bind of the dir itself carries no mounts under it.
mkdir -p "$r$base" && mount -c --bind /proc/self/fd/3 "$r$base"
for d in work ctl; do mount -c --bind "/proc/self/fd/3/$d" "$r$base/$d" && mount -o remount,bind,rw "$r$base/$d"; done
printf '%s\n' "$binds" | while read -r src target; do
  [ -n "$src" ] || continue
  mkdir -p "$r$target" && mount -c --bind "/proc/self/fd/3/$src" "$r$target" && mount -o remount,bind,rw "$r$target"
done
n=4; for d in $expose; do mkdir -p "$r$d" && mount -c --bind "/proc/self/fd/$n" "$r$d"; n=$((n+1)); done
for d in $hide; do mount -o remount,bind,ro,nosuid,nodev "$r$d"; done
exec 3<&- 4<&- 5<&- 6<&- 7<&- 8<&- 9<&-
cd "$r" && mkdir .host && pivot_root . .host && cd / && umount -l /.host && rmdir /.host
mount -o remount,bind,ro,nosuid,nodev /
if [ "$net" = net ] && command -v ip >/dev/null 2>&1; then ip link set lo up; fi
cd @WORKSPACE@
if [ "$caller" = root ]; then set -- setpriv --reuid="$uid" --regid="$gid" --clear-groups "$@"; else set -- setpriv "$@"; fi
exec "$@"
""".replace("@WORKSPACE@", WORKSPACE).replace("@NEW_ROOT@", NEW_ROOT)


@dataclass(frozen=True)
class Layout:
    """What one sandbox sees: its dirs, what is hidden and what is exposed again."""

    base: str
    network: bool
    hidden: tuple[str, ...]
    exposed: tuple[str, ...]
    resolv: str  # /etc/resolv.conf's target when it lives under a hidden dir, else ""
    # Writable dirs bound into the sandbox: (source relative to the sandbox dir, target);
    # the work dir at WORKSPACE first, then spec.writable_dirs (see writable_binds).
    binds: tuple[tuple[str, str], ...] = (("work", WORKSPACE),)


def is_root() -> bool:
    return os.geteuid() == 0


def sandbox_ids() -> tuple[int, int]:
    """The host uid and gid a sandbox's processes run as."""
    return (NOBODY, NOBODY) if is_root() else (os.getuid(), os.getgid())


def under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def ancestors(path: str) -> list[str]:
    """The dirs above path, from the top: /a/b/c -> /a, /a/b."""
    if not path:
        return []
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def hidden_dirs(root: Path) -> list[str]:
    """Dirs replaced by empty read-only ones: the caller's home, /root, /home (other users'
    homes are often world-readable) and the adapter root (where the other sandboxes live),
    each unless a private /tmp or another hidden dir covers it."""
    private = ["/tmp", "/run"]  # replaced by empty ones anyway
    dirs: list[str] = []
    for candidate in (os.path.expanduser("~"), "/root", "/home", str(root)):
        real = os.path.realpath(candidate)
        if candidate == str(root) and not os.path.isdir(real):
            real = os.path.realpath(os.path.dirname(real))  # not made yet: hide where it will be
        if real == "/" or not os.path.isdir(real) or any(under(real, d) for d in [*private, *dirs]):
            continue
        dirs = [d for d in dirs if not under(d, real)] + [real]
    return dirs


@functools.cache
def python_dirs() -> tuple[str, ...]:
    """The controller's interpreter and the site dir its pytest comes from: what a sandbox's
    ``python`` needs to see, wherever it lives."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    spec = importlib.util.find_spec("pytest")
    if spec is not None and spec.origin:
        dirs.add(str(Path(spec.origin).parent.parent))
    real = sorted({os.path.realpath(d) for d in dirs if os.path.isdir(d)})
    return tuple(d for d in real if not any(other != d and under(d, other) for other in real))


def layout(root: Path, base: Path, network: bool, writable_dirs: tuple[str, ...] = ()) -> Layout:
    hidden = hidden_dirs(root)
    covered = [*hidden, "/tmp", "/run"]
    exposed = tuple(d for d in python_dirs() if any(under(d, h) for h in covered))
    resolv = os.path.realpath("/etc/resolv.conf")
    keep_resolv = resolv if network and os.path.isfile(resolv) and any(under(resolv, h) for h in covered) else ""
    binds = writable_binds(writable_dirs)
    check_writable_binds(binds, str(base), covered)
    return Layout(str(base), network, tuple(hidden), exposed, keep_resolv, binds)


def writable_binds(writable_dirs: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The binds that make the work dir WORKSPACE and each of ``writable_dirs`` a writable dir
    of the sandbox's: (source under the sandbox dir, target). A dir inside another one (or
    inside WORKSPACE) needs no bind: it is made in that one's source (see host_dirs)."""
    binds = [("work", WORKSPACE)]
    for target in sorted(set(writable_dirs)):
        if not any(under(target, bound) for _, bound in binds):
            binds.append((f"dirs/{len(binds) - 1}", target))
    return tuple(binds)


def host_dirs(base: Path, binds: tuple[tuple[str, str], ...], writable_dirs: tuple[str, ...]) -> list[Path]:
    """The host dirs behind ``writable_dirs``, sources first, in the order to make them."""
    made = [base / source for source, _ in binds[1:]]
    for target in sorted(set(writable_dirs)):
        source, bound = next((source, bound) for source, bound in binds if under(target, bound))
        if target != bound:
            made.append(base / source / os.path.relpath(target, bound))
    return made


def check_writable_binds(binds: tuple[tuple[str, str], ...], base: str, writable: list[str]) -> None:
    """Refuse, in one line, a writable dir the sandbox's mounts cannot make: its mount point
    must exist on the host or be made in something writable while the mounts are built (the
    sandbox's own root, its /tmp and /run, a hidden dir's empty one, an earlier bind)."""
    for _, target in binds[1:]:
        covers_own = target in ("/tmp", "/run") or under(base, target) or under(WORKSPACE, target)
        if covers_own or any(under(target, d) for d in NOT_WRITABLE):
            raise ConfigError(f"writable_dirs: {target} would cover the sandbox's own mounts; choose another path")
        top = "/" + target.strip("/").split("/")[0]
        made_here = [*writable, *(bound for _, bound in binds if bound != target)]
        if (
            target == top
            or not os.path.lexists(top)
            or any(under(target, d) for d in made_here)
            or os.path.isdir(target)
        ):
            continue
        raise ConfigError(
            f"writable_dirs: the local adapter cannot make {target}: its parent is the host's, read-only, "
            f"and has no {os.path.basename(target)}; choose a new top-level dir (like /app) or one under /tmp"
        )


def root_entries() -> list[str]:
    """The host's top-level entries the sandbox's root binds read-only (all but its own)."""
    return sorted(name for name in os.listdir("/") if name not in OWN_TOP_LEVEL)


def user_tail(root_caller: bool, user_namespace: bool) -> list[str]:
    """After the mounts: become the sandbox's user, for good. (The bounding set is emptied
    only where a real uid switch follows: a root of a user namespace without it could not map
    its uid into the next one; there the exec as a non-zero uid drops every capability.)"""
    uid, gid = sandbox_ids()
    bounding = ["--bounding-set=-all"] if root_caller or is_root() else []
    tail = ["--no-new-privs", *bounding, "--inh-caps=-all", "--"]
    if root_caller:
        tail = [f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *tail]
    if user_namespace:
        # A user namespace of its own: per-sandbox RLIMIT_NPROC, and the uid it shows inside.
        tail += ["unshare", "--user", f"--map-user={uid}", f"--map-group={gid}", "--"]
    return tail


def bwrap_argv(plan: Layout, user_namespace: bool) -> list[str]:
    root_caller = is_root()
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--hostname", "sandbox"]
    if not plan.network:
        argv.append("--unshare-net")
    if not root_caller:
        argv.append("--unshare-user")
    # The root is bwrap's own tmpfs (made read-only last) with each of the host's top-level
    # entries bound read-only into it: a new top-level dir (WORKSPACE) needs a root it can be
    # made in, which the host's, read-only, is not.
    for name in root_entries():
        entry = "/" + name
        if os.path.islink(entry):
            argv += ["--symlink", os.readlink(entry), entry]
        elif os.path.exists(entry):
            argv += ["--ro-bind", entry, entry]
    argv += ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp"]
    if os.path.isdir("/run"):
        argv += ["--tmpfs", "/run"]
    for d in plan.hidden:
        argv += ["--tmpfs", d]
    # Dirs leading to what is bound into the empty ones, traversable by the sandbox's user
    # (left to itself, bwrap copies the modes of the host's, e.g. a 0700 pytest tmp dir).
    tmpfs = ["/tmp", "/run", *plan.hidden]
    targets = [plan.base, *plan.exposed, plan.resolv, *(target for _, target in plan.binds)]
    for target in targets:
        for parent in ancestors(target):
            if any(under(parent, t) and parent != t for t in tmpfs) or not os.path.lexists(parent):
                argv += ["--perms", "0755", "--dir", parent]
    if plan.resolv:
        argv += ["--ro-bind", plan.resolv, plan.resolv]
    base = plan.base
    argv += ["--ro-bind", base, base, "--bind", f"{base}/work", f"{base}/work", "--bind", f"{base}/ctl", f"{base}/ctl"]
    for source, target in plan.binds:
        argv += ["--bind", f"{base}/{source}", target]
    for d in plan.exposed:
        argv += ["--ro-bind", d, d]
    for d in plan.hidden:
        argv += ["--remount-ro", d]
    argv += ["--remount-ro", "/", "--chdir", WORKSPACE, "--cap-drop", "ALL"]
    if root_caller:  # kept only for setpriv to switch to nobody; it drops them itself
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        argv += ["--", "setpriv", *user_tail(True, user_namespace)]
    else:
        argv.append("--")
    return argv


def unshare_argv(plan: Layout, user_namespace: bool) -> list[str]:
    root_caller = is_root()
    uid, gid = sandbox_ids()
    argv = ["setpriv", "--pdeathsig", "KILL", "--", "unshare"]
    if not root_caller:
        argv += ["--user", "--map-root-user"]
    argv += ["--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--ipc", "--uts", "--cgroup"]
    if not plan.network:
        argv.append("--net")
    argv += ["--", "sh", "-c", SETUP, "setup", plan.base, "" if plan.network else "net"]
    argv += [" ".join(plan.hidden), " ".join(plan.exposed), plan.resolv, str(uid), str(gid)]
    argv += ["root" if root_caller else "user", "".join(f"{source} {target}\n" for source, target in plan.binds)]
    argv += list(root_plan(plan))
    # A non-root caller is root of the first user namespace here; the second one maps the
    # caller's own uid back, so the sandbox does not run as (powerless) uid 0.
    argv += user_tail(False, user_namespace or not root_caller)
    return argv


def root_plan(plan: Layout) -> tuple[str, str]:
    """The unshare mode's new root, built under NEW_ROOT: its entries (``d PATH`` a dir, ``f
    PATH`` a file, ``l TARGET<tab>PATH`` a symlink, one a line) and the mount table that fills
    it (fstab lines: a read-only recursive bind of each of the host's top-level entries, its
    own /proc and /dev, tmpfs for /tmp, /run, /dev/shm and over each hidden dir)."""
    entries, table = [], []

    def mount(source: str, target: str, kind: str, options: str) -> None:
        table.append(f"{fstab_field(source)} {fstab_field(NEW_ROOT + target)} {kind} {options} 0 0\n")

    for name in root_entries():
        host, made = "/" + name, NEW_ROOT + "/" + name
        if os.path.islink(host):
            entries.append(f"l {os.readlink(host)}\t{made}")
        elif os.path.isdir(host):
            entries.append(f"d {made}")
            mount(host, host, "none", "rbind")
        elif os.path.exists(host):
            entries.append(f"f {made}")
            mount(host, host, "none", "bind")
    own = ["/proc", "/dev", "/tmp", *(["/run"] if os.path.isdir("/run") else [])]
    entries += [f"d {NEW_ROOT}{d}" for d in own]
    mount("/proc", "/proc", "none", "rbind")
    mount("/dev", "/dev", "none", "rbind")
    mount("tmpfs", "/tmp", "tmpfs", "mode=1777,nosuid,nodev")
    if "/run" in own:
        mount("tmpfs", "/run", "tmpfs", "mode=755,nosuid,nodev")
    if os.path.isdir("/dev/shm"):
        mount("tmpfs", "/dev/shm", "tmpfs", "mode=1777,nosuid,nodev")
    for d in plan.hidden:
        mount("tmpfs", d, "tmpfs", "mode=755,nosuid,nodev")
    return "\n".join(entries), "".join(table)


def fstab_field(path: str) -> str:
    """A path as a field of an fstab line: its blanks and backslashes in octal."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


def sandbox_argv(mode: str, plan: Layout, user_namespace: bool) -> list[str]:
    """The command that turns into the sandbox, up to the supervisor's ``sh``."""
    if mode == "bwrap":
        return bwrap_argv(plan, user_namespace)
    if mode == "unshare":
        return unshare_argv(plan, user_namespace)
    return []


# -- probing: what works on this machine --------------------------------------------------


@dataclass(frozen=True)
class Probe:
    ok: bool
    why: str  # what failed, when it did
    user_namespace: bool = True  # root only: whether the final per-sandbox user namespace works


def _try(mode: str, user_namespace: bool) -> str:
    """Run ``true`` in a sandbox built exactly as the adapter builds one; '' when it works."""
    scratch = Path(tempfile.mkdtemp(prefix="orchard-probe-"))
    try:
        base = scratch / "box"
        (base / "work").mkdir(parents=True)
        (base / "ctl").mkdir()
        uid, gid = sandbox_ids()
        if is_root():
            for path in (base, base / "work", base / "ctl"):
                os.chown(path, uid, gid)
        argv = sandbox_argv(mode, layout(scratch, base, network=False), user_namespace) + ["sh", "-c", "true"]
        done = subprocess.run(argv, capture_output=True, timeout=20, env={"PATH": SYSTEM_PATH}, cwd=base / "work")
        if done.returncode != 0:
            return done.stderr.decode(errors="replace").strip().splitlines()[-1:][0] or f"exit {done.returncode}"
        return ""
    except (OSError, subprocess.TimeoutExpired, IndexError) as exc:
        return str(exc) or type(exc).__name__
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@functools.cache
def probe(mode: str) -> Probe:
    if platform.system() != "Linux":
        return Probe(False, f"namespaces are Linux-only (this is {platform.system()})")
    tool = "bwrap" if mode == "bwrap" else "unshare"
    for needed in (tool, "setpriv"):
        if shutil.which(needed, path=SYSTEM_PATH + ":" + os.environ.get("PATH", "")) is None:
            package = "bubblewrap" if needed == "bwrap" else "util-linux"
            return Probe(False, f"{needed} is not installed (package {package})")
    failed = _try(mode, user_namespace=True)
    if not failed:
        return Probe(True, "")
    if is_root() and not _try(mode, user_namespace=False):
        return Probe(True, "", user_namespace=False)
    return Probe(False, f"{tool} failed: {failed}")


def resolve(requested: str) -> tuple[str, Probe]:
    """The mode an adapter uses, and its probe: ``auto`` takes the first that works here."""
    if requested not in MODES:
        raise ConfigError(f"isolation must be one of {', '.join(MODES)}, got {requested!r}")
    if requested == "none":
        return "none", Probe(False, "isolation='none' was asked for")
    if requested != "auto":
        found = probe(requested)
        if not found.ok:
            raise ConfigError(f"isolation={requested!r} does not work here ({found.why}); use 'auto' or another mode")
        return requested, found
    reasons = []
    for mode in ("bwrap", "unshare"):
        found = probe(mode)
        if found.ok:
            return mode, found
        reasons.append(found.why)
    return "none", Probe(False, "; ".join(reasons))


# -- limits ----------------------------------------------------------------------------------


def per_namespace_nproc() -> bool:
    release = platform.release().split("-")[0].split(".")
    try:
        return tuple(int(part) for part in release[:2]) >= PER_NAMESPACE_NPROC
    except ValueError:
        return False


def _own_cgroup(controller: str) -> tuple[str, str] | None:
    """This process's cgroup for a controller: (hierarchy mount, path), v1 first, then v2."""
    lines = procfs.own_cgroups()
    if lines is None:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            mount = f"/sys/fs/cgroup/{controller}"
            if os.path.isdir(mount):
                return mount, path
    for line in lines:
        if line.startswith("0::"):
            for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                if os.path.exists(f"{mount}/cgroup.controllers"):
                    return mount, line[3:]
    return None


@functools.cache
def pids_cgroup_parent() -> tuple[str, str]:
    """A cgroup under this process's own in which sandboxes get pids cgroups: (dir, '') when
    one is writable, else ('', why not)."""
    found = _own_cgroup("pids")
    if found is None:
        return "", "no pids cgroup controller is mounted"
    mount, path = found
    own = os.path.join(mount, path.lstrip("/"))
    parent = os.path.join(own, f"orchard-async-{os.getuid()}")
    try:
        os.makedirs(parent, exist_ok=True)
        if os.path.exists(os.path.join(own, "cgroup.subtree_control")):  # v2: delegate pids down
            with open(os.path.join(own, "cgroup.subtree_control"), "w") as control:
                control.write("+pids")
            with open(os.path.join(parent, "cgroup.subtree_control"), "w") as control:
                control.write("+pids")
        probe_dir = os.path.join(parent, "probe")
        os.makedirs(probe_dir, exist_ok=True)
        try:
            with open(os.path.join(probe_dir, "pids.max"), "w") as limit:
                limit.write("1")
        finally:
            os.rmdir(probe_dir)
    except OSError as exc:
        return "", f"the pids cgroup {own} is not writable here ({exc.strerror or exc})"
    return parent, ""


def make_pids_cgroup(sandbox_id: str, pids: int) -> str:
    """A pids cgroup for one sandbox, or '' where none can be made."""
    parent, _ = pids_cgroup_parent()
    if not parent:
        return ""
    path = os.path.join(parent, sandbox_id)
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as limit:
            limit.write(str(pids + ADAPTER_PROCESSES))
    except OSError:
        remove_cgroup(path)
        return ""
    return path


def remove_cgroup(path: str) -> None:
    if path:
        try:
            os.rmdir(path)
        except OSError:
            pass


def reap_cgroups(reaped: set[str], live_ids: set[str]) -> None:
    """Remove the cgroups of sandboxes just reaped (their processes may take a moment to go),
    and any other empty sandbox cgroup whose launcher was killed before it could."""
    parent, _ = pids_cgroup_parent()
    if not parent:
        return
    deadline = time.monotonic() + 5
    for name in sorted(reaped):
        path = os.path.join(parent, name)
        while os.path.isdir(path) and time.monotonic() < deadline:
            remove_cgroup(path)
            if os.path.isdir(path):
                time.sleep(0.05)
    for entry in os.scandir(parent):
        if entry.is_dir() and entry.name.startswith("lo-") and entry.name not in live_ids:
            remove_cgroup(entry.path)  # a live sandbox's cgroup is busy: rmdir leaves it alone


# -- the interpreter ---------------------------------------------------------------------------


def interpreter() -> tuple[str, str]:
    """The interpreter sandboxes get as ``python`` and ``python3``, and its pytest version."""
    spec = importlib.util.find_spec("pytest")
    version = "missing"
    if spec is not None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        try:
            version = dist_version("pytest")
        except PackageNotFoundError:
            version = "present"
    return sys.executable, version


def write_python_shims(bin_dir: Path) -> None:
    """``python`` and ``python3`` that run the controller's interpreter. Scripts, not
    symlinks: a venv's interpreter finds its venv by the path it was started from."""
    bin_dir.mkdir()
    shim = f'#!/bin/sh\nexec {sys.executable} "$@"\n'
    for name in ("python", "python3"):
        path = bin_dir / name
        path.write_text(shim)
        path.chmod(0o755)

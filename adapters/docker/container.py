"""What a docker sandbox's container is: its create config (the self-destruct timer as its main
process, limits, mounts, network), built from the adapter's options and the spec. The adapter
(adapter.py) creates, starts and drives it."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
import uuid
from typing import Any

from orchard_async.adapters.docker.config import DockerConfig
from orchard_async.adapters.docker.fork import snapshot_tmpfs
from orchard_async.kit import container_reattach
from orchard_async.kit.container_shell import CTL_DIR, RELAYS_IN_MAIN, timer_args
from orchard_async.protocols import TIMER_NAME
from orchard_async.types import SandboxSpec

# Processes the adapter itself runs in every container, added to spec.pids so that the
# limit counts what commands may start: init, the timer and its sleep, the exec wrapper
# with its two sides and cat, the keepalive watchdog and its sleep (where the image's
# shell has no `read -t`), the two output relays, the shell, the command's subshell, and
# the controller watch (CONTROLLER_WATCH).
PIDS_OVERHEAD = 14

# The container's stdin is the controller's: the adapter attaches to it between create and
# start, and the container is created with StdinOnce, so the daemon closes it when that
# attach's connection goes (the controller closed it, or died, even by SIGKILL). This watch
# reads it (builtins only: nothing is written to it, nothing is forked per read) and at EOF
# ends the container as the shell's wrapper does (`kill -1`), unless it was made to outlive
# its controller ($4, the reattach grace, above 0): then it waits the grace and ends it only
# if no shell ever attached (an attached shell's session handles its own end, see
# container_reattach). It ends a container whose controller died before its shell attached,
# and backs up the shell exec's EOF and keepalive for every other: it does not depend on the
# daemon closing an exec's stdin. $3 the shell's pid file.
CONTROLLER_WATCH = """
while read -r _o_x; do :; done
if [ "$4" != 0 ]; then
  [ -e "$3" ] && exit 0
  sleep "$4"
  [ -e "$3" ] && exit 0
fi
kill -KILL -1
"""

# An extendable sandbox's timer (spec.max_extension) goes on past the TTL while the deadline
# in $5 (epoch seconds, written by the controller into a host dir bound read-only at TTL_DIR:
# nothing in the container can change it) is later, but never past $6, the hard cap (the TTL
# plus spec.max_extension). It checks the clock after every nap: a nap cut short (its sleep
# killed from inside) naps again to the deadline; a deadline that is not a number ends it.
TTL_LOOP = """
if [ -e "$_o_pid" ] && [ -n "$5" ]; then
  while read -r _o_d <"$5" && _o_n=$(date +%s) && [ "$_o_d" -gt "$_o_n" ]; do
    if [ "$_o_d" -gt "$6" ]; then _o_d=$6; fi
    if [ "$_o_d" -le "$_o_n" ]; then break; fi
    _o_nap $((_o_d - _o_n))
  done
fi
"""
TTL_DIR = "/run/orchard-ttl"  # where an extendable sandbox sees its deadline's host dir, read-only
DEADLINE_FILE = "deadline"

# The container's main process (under docker-init): the self-destruct timer, in sh.
#
# * A controller killed between starting a container and attaching its shell leaves a
#   container no shell will ever end: CONTROLLER_WATCH ends it. Where that has no attach
#   (none was made), the timer first waits the attach grace ($1) and goes on to the rest of
#   the TTL ($2) only if a shell has attached: the shell writes its pid to SHELL_PID ($3)
#   as it starts.
# * It relays SIGUSR1 to the shell: the client's timeout interrupt. Docker can signal a
#   container (its init forwards the signal to the timer) but not an exec, and a second
#   exec to run `kill` would need a free pid, which a command that hit the pids limit
#   has taken. `read` and `kill` are builtins: relaying forks nothing.
# * It sleeps in the background: a shell runs traps only between commands, and `wait`
#   returns at once for a trapped signal. A background list's stdin is /dev/null unless
#   redirected: the watch gets the container's stdin through fd 3.
# * It waits by the clock (_o_wait): a sleep cut short (a command may kill any process it
#   sees) sleeps again to the same end. An image without `date` gets one plain sleep.
TIMER = f"""
_o_pid=$3
exec 3<&0 0</dev/null
{{ {CONTROLLER_WATCH}}} <&3 3<&- >/dev/null 2>&1 &
exec 3<&-
_o_relay() {{ if read -r _o_p <"$_o_pid"; then kill -USR1 "$_o_p"; fi; }}
trap _o_relay USR1
_o_nap() {{ sleep "$1" & _o_s=$!; while kill -0 "$_o_s" 2>/dev/null; do wait "$_o_s"; done; }}
_o_wait() {{
  _o_n=$(date +%s 2>/dev/null) || {{ _o_nap "$1"; return; }}
  _o_e=$((_o_n + $1))
  while [ "$_o_n" -lt "$_o_e" ]; do _o_nap $((_o_e - _o_n)); _o_n=$(date +%s) || return; done
}}
_o_wait "$1"
if [ -e "$_o_pid" ]; then _o_wait "$2"; fi
{TTL_LOOP}"""


SWITCH_USER_CAPABILITIES = ("SETGID", "SETUID")


def container_config(
    config: DockerConfig,
    spec: SandboxSpec,
    image: str,
    labels: dict[str, str],
    *,
    workdir: str,
    relays_in_main: bool,
    reattach_grace: float,
    hosts_file: str | None,
    ttl_dir: str | None = None,
    hard_cap: float = 0.0,
) -> dict[str, Any]:
    """The create body of a sandbox's container. ``relays_in_main``: the output relays run in its
    main process (no exec for them); ``reattach_grace``: it outlives its controller that long
    (container_reattach); ``hosts_file``: no network of the daemon's at all (``light_network``),
    this file bound read-only as /etc/hosts; ``ttl_dir``: the host dir of an extendable
    sandbox's deadline, bound read-only at TTL_DIR, its timer never going past ``hard_cap``
    (epoch seconds)."""
    host: dict[str, Any] = {
        "AutoRemove": True,  # the timer's end is the container's end
        "Init": True,  # reaps zombies of commands; forwards the end signal to the timer
        "NetworkMode": "bridge" if spec.network == "on" else "none",
        "PidsLimit": (spec.pids + PIDS_OVERHEAD) if spec.pids else None,
        "ReadonlyRootfs": config.read_only,
        "Tmpfs": tmpfs_mounts(config, spec, workdir),
        "LogConfig": {"Type": "none", "Config": {}},  # the timer prints nothing
        "CapDrop": ["ALL"],  # the shell server needs none (see the package's docstring)
        "SecurityOpt": ["no-new-privileges"],
    }
    if spec.switch_users:  # su/setpriv to the image's other users, and nothing else
        host["CapAdd"] = list(SWITCH_USER_CAPABILITIES)
    if spec.cpu:
        host["NanoCpus"] = int(spec.cpu * 1e9)
    if spec.memory_bytes:
        # Swap as large as memory means no swap: over the limit, the OOM killer acts.
        host["Memory"] = host["MemorySwap"] = spec.memory_bytes
    if spec.gpus:  # what `docker run --gpus N` asks for: any driver that offers the gpu capability
        host["DeviceRequests"] = [{"Driver": "", "Count": spec.gpus, "DeviceIDs": None, "Capabilities": [["gpu"]]}]
    timer = ["sh", "-c", (RELAYS_IN_MAIN if relays_in_main else "") + TIMER, TIMER_NAME]
    watch_grace = str(math.ceil(reattach_grace)) if reattach_grace else "0"
    body: dict[str, Any] = {}
    mounts = []
    if hosts_file:
        # runc makes the network namespace (lo only) without libnetwork; /etc/hosts is ours
        body["NetworkDisabled"] = True
        mounts.append({"Type": "bind", "Source": hosts_file, "Target": "/etc/hosts", "ReadOnly": True})
    deadline: list[str] = []
    if ttl_dir:
        mounts.append({"Type": "bind", "Source": ttl_dir, "Target": TTL_DIR, "ReadOnly": True})
        deadline = [f"{TTL_DIR}/{DEADLINE_FILE}", str(math.ceil(hard_cap))]
    if mounts:
        host["Mounts"] = mounts
    return body | {
        "Image": image,
        "Entrypoint": container_reattach.adoptable_entry(timer, workdir) if reattach_grace else timer,
        "Cmd": [*timer_args(spec.ttl, config.attach_grace), watch_grace, *deadline],
        # the controller's stdin (CONTROLLER_WATCH), closed by the daemon when its attach goes
        "OpenStdin": True,
        "StdinOnce": True,
        "Env": [f"{key}={value}" for key, value in spec.env.items()],
        "Labels": labels,
        "HostConfig": {key: value for key, value in host.items() if value is not None},
    }


def tmpfs_mounts(config: DockerConfig, spec: SandboxSpec, workdir: str) -> dict[str, str]:
    """Docker mounts tmpfs noexec by default; sandboxes run what they write, so add exec.
    A read-only root gets tmpfs for the places the sandbox must write (the workdir, the
    control dir, spec.writable_dirs)."""
    mounts = dict(config.tmpfs)
    if spec.snapshot:
        mounts.update(snapshot_tmpfs())
    if config.read_only:
        mounts.setdefault(workdir, "")
        mounts.setdefault(CTL_DIR, "mode=0700")
        for path in spec.writable_dirs:
            mounts.setdefault(path, "")
    return {path: _with_exec(options) for path, options in mounts.items()}


def _with_exec(options: str) -> str:
    words = [word for word in options.split(",") if word]
    if "noexec" not in words and "exec" not in words:
        words.append("exec")
    return ",".join(words)


def write_deadline(ttl_dir: str, expires_at: float) -> None:
    """Set an extendable sandbox's deadline (TTL_LOOP) in its host dir: whole seconds, replaced
    at once (the dir, not the file, is bound: a rename shows through)."""
    staged = os.path.join(ttl_dir, f".{uuid.uuid4().hex[:8]}")
    with open(staged, "w") as fh:
        fh.write(f"{math.ceil(expires_at)}\n")
    os.chmod(staged, 0o644)
    os.replace(staged, os.path.join(ttl_dir, DEADLINE_FILE))


def remove_ttl_dir(ttl_dir: str | None) -> None:
    if ttl_dir:
        shutil.rmtree(ttl_dir, ignore_errors=True)


def ttl_deadline(mounts: list[dict[str, Any]] | None) -> float:
    """An extendable container's deadline, from its entry in the daemon's container list (its
    TTL_DIR mount's source, on this machine): 0 when it has none or it cannot be read here."""
    for mount in mounts or ():
        if mount.get("Destination") == TTL_DIR:
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(mount.get("Source") or "", DEADLINE_FILE)) as fh:
                    return float(fh.read().strip())
    return 0.0


def reap_ttl_dirs(hosts: str, containers: set[str], min_age: float = 60.0) -> None:
    """Remove the deadline dirs of containers that are gone (their controller was killed before
    it removed them); a young one may be of a container still being created."""
    root = os.path.join(hosts, "ttl")
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):
                if name not in containers and time.time() - os.stat(path).st_mtime > min_age:
                    shutil.rmtree(path, ignore_errors=True)

"""Sandboxes that outlive their controller for a while, for another to take over (``attach``):
what ``orchard-async serve`` needs to re-adopt its sandboxes after a restart.

With a reattach grace (an adapter option of docker and kubernetes), a sandbox does not end
when its controller goes: its shell session ends (every process but init and the timer is
frozen, then killed, so no command of the old session writes on), its files stay, and a new
controller has the grace to attach a new shell. If none does, it ends as before. The
sandbox carries the label ``orchard.reattach`` (its grace): ``reap`` leaves it to end itself.
Without a grace every script of container_shell is the one that runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

import anyio

from orchard_async.errors import CreateFailed, SandboxLost
from orchard_async.kit.container_shell import CTL_DIR, DEFAULT_WORKDIR, KEEPALIVE_CHECKS, SHELL_PID, WATCHDOG

TIMER_PID = f"{CTL_DIR}/timer.pid"  # the timer's pid: the process the session's end must spare
ORPHANED = f"{CTL_DIR}/orphaned"  # exists while an ended session's processes are being killed
WORKDIR_FILE = f"{CTL_DIR}/workdir"  # the sandbox's workdir, for a controller that attaches later

# The container's main process in reattach mode: records its pid and the workdir, then
# becomes the timer (exec keeps the pid). `$1` the control dir, `$2` the workdir; the timer's
# argv follows. Its pid comes from /proc/self/stat, not `$$`: Kubernetes reads `$$` in a pod's
# command as an escaped `$`.
RECORD_TIMER = (
    'mkdir -p "$1" 2>/dev/null; read -r _o_p _o_x </proc/self/stat; echo "$_o_p" >"$1/timer.pid"; '
    'printf %s "$2" >"$1/workdir"; shift 2; exec "$@"'
)

# The shell exec in reattach mode: as SHELL_WRAPPER, but when the controller goes (EOF, or the
# keepalive watchdog's silence, which then kills only the relay), the left side marks the
# session orphaned (before its end of the pipe closes, so the server's side does not end
# the container) and becomes ORPHAN. $1 keepalive ms, $2 checks, $3 WATCHDOG, $4 ORPHAN,
# $5 the grace in seconds.
ADOPTABLE_WRAPPER = f"""
{{ exec 3<&0 </dev/null
  cat <&3 3<&- & _o_c=$!
  exec 3<&-
  if [ "$1" != 0 ]; then
    _o_sh=sh; if command -v bash >/dev/null 2>&1; then _o_sh=bash; fi
    : | "$_o_sh" -c "$3" orchard-keepalive "$_o_c" "$1" "$2" "$_o_c" >/dev/null 2>&1 &
  fi
  wait "$_o_c"; : >{ORPHANED}
  exec sh -c "$4" orchard-orphan {TIMER_PID} {SHELL_PID} {ORPHANED} "$5" >/dev/null 2>&1 </dev/null
}} | {{ sh -s; [ -e {ORPHANED} ] || kill -KILL -1; }}
"""

# An orphaned session's end: every process of this container (its cgroup: a kubernetes pod's
# other containers, such as the egress filter, share its PID namespace) but init, the timer
# (and its sleep) and this one is stopped (twice: a process forking while the first pass ran
# is caught by the second), then killed; only builtins, so a full pids limit cannot stop it.
# Then it waits the grace: if a new shell wrote its pid meanwhile, the sandbox is adopted and
# this ends; else the sandbox ends. With no timer on record (not started in reattach mode) it ends the sandbox at once.
# $1 TIMER_PID, $2 SHELL_PID, $3 ORPHANED, $4 the grace.
ORPHAN = """
_o_tf=$1; _o_sf=$2; _o_of=$3; _o_grace=$4
read -r _o_me _o_x </proc/self/stat
read -r _o_t <"$_o_tf" 2>/dev/null || kill -KILL -1
read -r _o_old <"$_o_sf" 2>/dev/null
_o_cgroup() { _o_g=; while read -r _o_l; do _o_g="$_o_g$_o_l;"; done <"$1"; }  # every line: one a hierarchy on v1
_o_cgroup /proc/self/cgroup; _o_own=$_o_g
_o_all() {
  for _o_d in /proc/[0-9]*; do
    _o_p=${_o_d#/proc/}
    case $_o_p in 1|"$_o_me"|"$_o_t") continue ;; esac
    _o_cgroup "$_o_d/cgroup" 2>/dev/null && [ "$_o_g" = "$_o_own" ] || continue
    read -r _o_s <"$_o_d/stat" 2>/dev/null || continue
    set -- ${_o_s##*) }
    [ "$2" = "$_o_t" ] && continue
    kill -"$_o_sig" "$_o_p" 2>/dev/null
  done
}
_o_sig=STOP; _o_all; _o_all
_o_sig=KILL; _o_all
rm -f "$_o_of"
sleep "$_o_grace"
read -r _o_new <"$_o_sf" 2>/dev/null
[ "$_o_new" != "$_o_old" ] || kill -KILL -1
"""

# What a controller about to attach runs first (a short exec): whether the sandbox can take a
# new shell, and its workdir. Prints `<state> <workdir>`: "free" (no live session), "busy"
# (another controller's shell is alive), "ending" (an old session is being killed), or
# "fixed" (not started in reattach mode: it ends with its controller, nothing to attach to).
ATTACH_CHECK = f"""
if [ ! -e {TIMER_PID} ]; then _o_st=fixed
elif [ -e {ORPHANED} ]; then _o_st=ending
elif read -r _o_p <{SHELL_PID} 2>/dev/null && [ -n "$_o_p" ] && kill -0 "$_o_p" 2>/dev/null; then _o_st=busy
else _o_st=free; fi
_o_w=; read -r _o_w <{WORKDIR_FILE} 2>/dev/null
printf '%s %s\\n' "$_o_st" "$_o_w"
"""


async def wait_attachable(run_check: Callable[[], Awaitable[bytes]], name: str, patience: float) -> str:
    """Until the sandbox can take a new shell (ATTACH_CHECK says "free"): its workdir.
    "ending" and "busy" are waited out for ``patience`` seconds (an old session being killed;
    a frozen controller's, which its keepalive ends), then CreateFailed (retry later); so is
    no answer (an ending session kills the check too); "fixed" is SandboxLost: it was not
    made to be attached to."""
    deadline = time.monotonic() + patience
    while True:
        state, workdir = parse_attach_check(await run_check())
        if state == "free":
            return workdir or DEFAULT_WORKDIR
        if state == "fixed":
            raise SandboxLost(f"sandbox {name} was made without a reattach grace: it ends with its controller")
        if time.monotonic() >= deadline:
            if not state:
                raise CreateFailed(f"sandbox {name} did not answer the attach check; retry later")
            raise CreateFailed(f"sandbox {name} still has a live shell session of another controller; retry later")
        await anyio.sleep(0.25)


def adoptable_entry(command: list[str], workdir: str) -> list[str]:
    """The timer's argv wrapped for reattach mode (see RECORD_TIMER)."""
    return ["sh", "-c", RECORD_TIMER, "orchard-record", CTL_DIR, workdir, *command]


def attach_check_command() -> list[str]:
    return ["sh", "-c", ATTACH_CHECK]


def parse_attach_check(output: bytes) -> tuple[str, str]:
    """ATTACH_CHECK's answer: (state, workdir); ("", "") when it printed nothing readable."""
    state, _, workdir = output.decode(errors="replace").strip().partition(" ")
    return (state, workdir) if state in ("free", "busy", "ending", "fixed") else ("", "")


def shell_command(keepalive: float, reattach_grace: float) -> list[str]:
    """The shell exec's argv in reattach mode (ADOPTABLE_WRAPPER): container_shell's, except
    that the controller's going ends the session, not the container, for ``reattach_grace``
    seconds; ``keepalive`` as there (0: EOF alone tells)."""
    grace = str(max(1, math.ceil(reattach_grace)))
    ms = str(round(keepalive * 1000))
    return ["sh", "-c", ADOPTABLE_WRAPPER, "orchard-shell", ms, str(KEEPALIVE_CHECKS), WATCHDOG, ORPHAN, grace]

"""A bash lane: Orchard's ``bash -c`` commands without an exec of bash per command.

Orchard runs every command as ``bash -c COMMAND``: a fresh bash process. The sandbox's own
shell server is POSIX ``sh``, so the plain way (jobs.orchard_script) execs a new bash per
command, which is most of an Orchard round trip (fork + exec of bash ~1.6 ms, against
~0.45 ms for a fork of a bash that is already running; docs/performance.md).

The lane is a second shell server per sandbox, the same script (orchard_async.kit.shell) run by
``bash -s`` over ``Sandbox.open_stream``. Each command runs in a forked subshell of that
long-lived bash, which starts from the same state every time: the server's state as it was
when the lane started, never anything an earlier command did (a subshell's changes die with
it). What the server itself defines (its ``_o_*`` variables and functions, its traps, the
function frame it would run in) is removed or avoided before the command runs, so a command
sees what ``bash -c`` would show it. Differences that remain, and cannot go without an exec:
``$$`` and ``$PPID`` name the lane (a subshell keeps its parent's), ``$!`` is the previous
command's pid, ``$-`` has ``s`` where ``bash -c`` has ``c``, a syntax error is reported by
``eval:`` where ``bash -c`` says ``-c:``, and ``declare -p`` shows ``SECONDS`` (reset to 0) and
``PIPESTATUS`` with values. A signal a command sends to ``$$`` therefore reaches the lane: TERM,
HUP, INT and QUIT it catches and ignores for that reason (its commands get them at their default),
USR1 reads as the command's timeout, any other that kills (``kill -9 $$``) ends the lane: that
command fails as ``sandbox_lost`` and the next one gets a new lane.

A timeout is signalled to the lane by a ``kill`` run in the sandbox's main shell, so it waits
for a native command running there at that moment (Orchard's own commands are one at a time).

Used only where it can be the same as ``bash -c``: not for ``login_shell`` (``bash --login -i``
reads profiles and is interactive), not with an ``env`` naming a variable bash reads only at
its start (``BASH_ENV``, ``SHELLOPTS``, ...), not in a sandbox whose environment has one, not
without bash; and only where the service can read the command's output through FIFOs it
shares with the sandbox (the local adapter), since spooled output would cost a ``wc`` and a
``head`` process per command, more than the exec saved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from typing import Any

from orchard_async.kit.sandbox import ShellSandbox
from orchard_async.kit.shell import SERVER_SCRIPT, ShellClient, make_output_pipes, quote

log = logging.getLogger("orchard_async.apps.serve")

ENV_RESETS_SIGNALS = "env --default-signal true"  # GNU coreutils 8.31 and later

# Variables bash reads only when it starts: with one of them set, a forked subshell is not a
# fresh `bash -c`, so such a command takes the plain way.
STARTUP_VARIABLES = ("BASH_ENV", "SHELLOPTS", "BASHOPTS", "POSIXLY_CORRECT")

# Every name the server script and the lane define: removed in the command's subshell before it
# runs (tests/service/test_bash_lane.py checks that none is left).
SERVER_FUNCTIONS = "_o_tree _o_children _o_end _o_int _o_size _o_send _o_x _o_w _o_b"
SERVER_VARIABLES = (
    "_o_C _o_O _o_M _o_busy _o_p _o_t _o_in _o_rc _o_n _o_os _o_es _o_ch _o_c"
    " _o_f _o_run _o_nonce _o_head _o_tail _o_cwd _o_env _o_cmd _o_go"
)

# The lane's first line, read by bash's own parser: a loop that reads every later chunk (the
# server script, then one frame per command, each ended by a NUL) and evals it. The command's
# subshell is started from this line, so it runs outside any function (FUNCNAME, `return` and
# `local` behave as in `bash -c`), and its text is eval'd on line 1, as `bash -c` numbers it
# ("bash: line 1: x: command not found", $LINENO), however many frames came before.
LANE_LOOP = (
    'while IFS= read -r -d \'\' _o_f; do eval "$_o_f"; if [ "$_o_run" = 1 ]; then _o_run=0;'
    ' (eval "$_o_go") <"$_o_in" >"$_o_O/o" 2>"$_o_O/e" & _o_w "$_o_nonce" "$_o_head" "$_o_tail"; fi; done\n'
)

# Appended to the server script. `_o_b` takes a frame's arguments (those of `_o_x`). `_o_go`,
# one line, is what the subshell runs: reset the server's traps, go to the cwd the way Orchard
# does (a missing one is `/`), export the request's env, keep the command where `bash -c` keeps
# it (BASH_EXECUTION_STRING), remove every server name, and eval it. A command's `kill $$`
# signals the lane (a subshell's $$ is its parent's): TERM, HUP, INT and QUIT must not end it.
LANE_SCRIPT = rf"""
trap : TERM HUP INT QUIT
_o_b() {{
  _o_nonce=$1 _o_head=$2 _o_tail=$3 _o_in=/dev/null _o_t=0 _o_cwd=$5 _o_env=$6 _o_cmd=$7 _o_run=1
  if [ -n "$8" ]; then printf %s "$8" | base64 -d >"$_o_C/i"; _o_in=$_o_C/i; fi
}}
_o_go='set --; trap - EXIT USR1 TERM HUP INT QUIT; cd -- "$_o_cwd" 2>/dev/null || cd /; eval "$_o_env"; BASH_EXECUTION_STRING=$_o_cmd; unset -f {SERVER_FUNCTIONS}; unset -v {SERVER_VARIABLES}; BASH_SUBSHELL=0; SECONDS=0; eval "$BASH_EXECUTION_STRING"'
"""


class LaneClient(ShellClient):
    """The shell client speaking to a lane (see LANE_LOOP and LANE_SCRIPT)."""

    def startup(self, args: str) -> str:
        return LANE_LOOP + args + SERVER_SCRIPT + LANE_SCRIPT + "\0"

    def frame(self, args: list[str]) -> str:
        return "_o_b " + " ".join(args) + "\0"


def usable_for(request: Any) -> bool:
    """Whether this Orchard request means the same in the lane as in a new `bash -c`."""
    if request.login_shell:
        return False
    return not any(name in STARTUP_VARIABLES or name.startswith("BASH_FUNC_") for name in request.env or {})


async def open_lane(sandbox: Any) -> LaneClient | None:
    """Start a lane in the sandbox, or None where it cannot be the same as `bash -c` (see
    the module docstring); the plain way is then used for every command of that sandbox."""
    if not isinstance(sandbox, ShellSandbox):
        return None
    main = sandbox._client  # its shell: where its FIFOs are
    pipes = main.output_pipes
    if not pipes or main.output_relays:
        return None
    name = "lane-" + secrets.token_hex(4)
    ctl = f"{sandbox.spool_dir}/{name}"
    startup = "|".join(STARTUP_VARIABLES)
    probe = await sandbox.exec(
        f"command -v bash >/dev/null && ! env | grep -qE '^({startup})=' && mkdir -p -- {quote(ctl)} && "
        f"{{ {ENV_RESETS_SIGNALS} 2>/dev/null && echo reset; true; }}",
        timeout=30,
    )
    if probe.exit_code != 0:
        return None
    # The lane is started as a background job, with SIGINT and SIGQUIT ignored, which a bash can
    # never reset for its commands: through `env --default-signal` it starts with none ignored.
    reset = ["env", "--default-signal"] if probe.text.strip() == "reset" else []
    lane_pipes = os.path.join(pipes, name)
    fifo = os.stat(os.path.join(pipes, "o"))
    owner = None if fifo.st_uid == os.getuid() else (fifo.st_uid, fifo.st_gid)
    os.mkdir(lane_pipes, 0o755)
    if owner is not None:
        os.chown(lane_pipes, *owner)
    make_output_pipes(lane_pipes, owner)

    async def interrupt(client: ShellClient) -> None:
        # The lane's pid as the sandbox sees it, signalled from inside (its own pid namespace).
        await sandbox.exec(f"kill -USR1 {client.server_pid}", timeout=30)

    stream = await sandbox.open_stream([*reset, "bash", "-s"])
    lane = LaneClient(
        stream,
        workdir=main.workdir,
        interrupt=interrupt,
        output_cap=main.head + main.tail,
        output_pipes=lane_pipes,
    )
    try:
        await lane.start(ctl)
    except BaseException:
        await lane.close()
        raise
    return lane


async def lane_for(box: Any) -> LaneClient | None:
    """The box's lane, or None: then this command takes the plain way. A lane starts in the
    background at the box's first Orchard command (its start, ~25 ms at load 10, would
    otherwise fall on that command); a lane that died (a command's ``kill -9 $$``) is
    replaced the same way. Callers hold ``box.lock``."""
    lane = box.lane
    if isinstance(lane, asyncio.Task):
        if not lane.done():
            return None
        box.lane = lane = (None if lane.cancelled() else lane.result()) or False
    if lane is False:
        return None
    if lane is not None and not lane.lost:
        return lane
    await close_lane(box)
    box.lane = asyncio.get_running_loop().create_task(_opened(box))
    return None


async def _opened(box: Any) -> LaneClient | None:
    try:
        return await open_lane(box.sandbox)
    except Exception as exc:  # noqa: BLE001 - no lane is the plain way, never a failed command
        log.warning("no bash lane for sandbox %s: %s: %s", box.id, type(exc).__name__, exc)
        return None


async def close_lane(box: Any) -> None:
    lane, box.lane = box.lane, None
    if isinstance(lane, asyncio.Task):
        lane.cancel()
        with contextlib.suppress(BaseException):
            await lane
        lane = None if lane.cancelled() or lane.exception() else lane.result()
    if lane:
        with contextlib.suppress(Exception):
            await lane.close()

"""The container shell: how an adapter whose sandboxes are containers (docker, kubernetes)
runs the shell-session protocol (orchard_async.kit.shell) over one long-lived exec.

What is the same for every such backend lives here, and an adapter brings only its exec
connection (an ``ExecConnection`` of orchard_async.kit.exec_streams: an aiodocker attach stream,
a Kubernetes exec websocket) and its way of interrupting the shell:

* the commands the container runs: the shell that ends its container when the controller
  goes (``shell_command``), the output relays (``relay_command``), the timer's arguments;
* the bootstrap: ``start_shell`` sends the preamble, opens the relays, starts the server,
  and turns what went wrong into ConfigError (the image's doing) or CreateFailed;
* ``is_abandoned``: which sandbox ``reap`` removes.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from orchard_async.errors import BackendUnavailable, ConfigError, CreateFailed, SandboxLost
from orchard_async.kit.egress import NetworkSwitch
from orchard_async.kit.exec_streams import (
    RELAYS_FAILED,
    OutputStream,
    RelaysFailed,
    SplitRelay,
    close_streams,
)
from orchard_async.kit.labels import REATTACH, expiry
from orchard_async.kit.sandbox import ShellSandbox
from orchard_async.kit.shell import READY_TIMEOUT, CgroupShellClient, ShellClient, quote
from orchard_async.kit.streams import StreamOpener

DEFAULT_WORKDIR = "/workspace"
CTL_DIR = "/tmp/.orchard"  # the shell protocol's scratch files; a tmpfs or emptyDir on read-only roots
OUT_DIR = f"{CTL_DIR}/out"  # the output FIFOs the relays copy to the controller
SHELL_PID = f"{CTL_DIR}/shell.pid"  # the shell writes its pid here: the timer's sign that it attached
SETUP_FAILED = "@@ORCHARD-SETUP-FAILED"  # the exec's stderr when the preamble failed
KEEPALIVE_CHECKS = 4  # the keepalive watchdog looks this many times per keepalive period

SHELL_ONLY = ["sh", "-s"]

# The exec's command: the protocol shell, wrapped so that the container ends with it. `cat`
# relays stdin and sees EOF as soon as the connection closes (the controller closed it or
# died, even by SIGKILL), even while a command runs and the shell is not reading; if the
# shell dies, its side notices. Either side then kills every process but the PID namespace's
# init (`kill -1`: docker-init, or the pod's pause container), the timer among them, and the
# container ends. Signalling init does not work: the kernel drops signals sent to a
# namespace's init from inside unless it has a handler.
SHELL_ENDS_CONTAINER = ["sh", "-c", "{ cat; kill -KILL -1; } | { sh -s; kill -KILL -1; }"]

# EOF alone needs the backend to close the exec's stdin when the client's connection goes,
# and a controller can also stop without closing anything (frozen, stalled). With a
# keepalive the wrapper also runs a watchdog (WATCHDOG) over the relay: the controller sends
# a byte on an idle stream every second (ExecStream.beat), and when the relay's read count
# (rchar in /proc/<cat>/io) has not moved for $1 milliseconds, the watchdog kills every
# process the same way. The watchdog's output goes nowhere: the shell's pipe has one writer,
# the relay. While a command runs the shell reads nothing, so heartbeats wait in that pipe
# (64 KiB: one command may run about 18 hours before a full pipe stalls the relay and the
# watchdog takes the silence for a dead controller; TTLs are far shorter).
SHELL_WRAPPER = """
{ exec 3<&0 </dev/null
  cat <&3 3<&- & _o_c=$!
  exec 3<&-
  if [ "$1" != 0 ]; then
    _o_sh=sh; if command -v bash >/dev/null 2>&1; then _o_sh=bash; fi
    : | "$_o_sh" -c "$3" orchard-keepalive "$_o_c" "$1" "$2" >/dev/null 2>&1 &
  fi
  wait "$_o_c"; kill -KILL -1
} | { sh -s; kill -KILL -1; }
"""

# The keepalive watchdog: $1 the relay's pid, $2 the keepalive in milliseconds, $3 checks per
# keepalive, $4 what it kills on silence (default -1, every process: the container ends). It
# waits with `read -t` on a pipe nobody writes to (its stdin, reopened
# read-write so it never sees EOF): no process per tick, so it keeps working when the
# command has taken every pid. bash and busybox sh have `read -t`; with a shell that has
# not (dash without bash), it forks `sleep`, and dies if a full pids limit refuses the
# fork (the EOF path and the TTL still hold).
WATCHDOG = """
_o_c=$1; _o_checks=$3; _o_ms=$(($2 / $3))
_o_every=$((_o_ms / 1000)).$((_o_ms % 1000 / 100))$((_o_ms % 100 / 10))$((_o_ms % 10))
exec 4<>/proc/self/fd/0 0</dev/null
read -t 0.01 _o_x <&4 2>/dev/null
if [ $? = 2 ]; then _o_tick() { sleep "$_o_every"; }; else _o_tick() { read -t "$_o_every" _o_x <&4; }; fi
_o_last=; _o_quiet=0
while [ "$_o_quiet" -lt "$_o_checks" ]; do
  _o_tick
  read -r _o_k _o_n <"/proc/$_o_c/io" || exit 0
  if [ "$_o_n" = "$_o_last" ]; then _o_quiet=$((_o_quiet + 1)); else _o_quiet=0; _o_last=$_o_n; fi
done
kill -KILL "${4:--1}"
"""

# Command output never lands on the container's disk (a command printing 2 GB must not fill
# it): the server points a command's stdout and stderr at two FIFOs, and one exec per FIFO
# relays it to the controller (the shell protocol's relay mode), which keeps the head and
# tail and counts the rest. Each relay makes its FIFO, says it is ready, and becomes `cat`
# holding the FIFO open read-write (so it never reads an end between commands). It is read
# only while a command runs: between commands the connection's buffers fill, the FIFO behind
# them fills, and a background writer blocks, using no memory here. `$1` the FIFO's
# directory, `$2` its name.
RELAY = (
    'mkdir -p "$1" && { [ -p "$1/$2" ] || mkfifo -m 600 "$1/$2"; } && printf "@@RELAY %s\\n" "$2" && exec cat <>"$1/$2"'
)


# The same two relays in the container's main process, ahead of its timer, where a backend can
# attach to that process's stdout and stderr without an exec (docker: each exec is a runc
# process start, about as costly to the daemon as the container's own start). stdout relays
# FIFO "o", stderr FIFO "e"; the ready lines go first, one on each. When the FIFOs cannot be
# made (the image's user cannot write /tmp), why goes to stdout, then RELAYS_FAILED: the two
# streams are copied apart, so one stream carries both. The main process's own output then
# goes nowhere: only the relays may write to the streams.
RELAYS_IN_MAIN = f"""
_o_d={quote(OUT_DIR)}
if {{ mkdir -p "$_o_d" && {{ [ -p "$_o_d/o" ] || mkfifo -m 600 "$_o_d/o"; }} && {{ [ -p "$_o_d/e" ] || mkfifo -m 600 "$_o_d/e"; }}; }} 2>&1; then
  printf '@@RELAY o\\n'; printf '@@RELAY e\\n' >&2
  cat <>"$_o_d/o" & cat <>"$_o_d/e" >&2 &
else
  echo {RELAYS_FAILED}
fi
exec >/dev/null 2>&1
"""


def shell_command(keepalive: float = 0.0) -> list[str]:
    """The exec's argv: the shell that ends its container, with the watchdog after
    ``keepalive`` seconds (whole milliseconds; 0: none, EOF and the TTL end it). A sandbox
    that outlives its controller uses container_reattach.shell_command instead."""
    if not keepalive:
        return SHELL_ENDS_CONTAINER
    return ["sh", "-c", SHELL_WRAPPER, "orchard-shell", str(round(keepalive * 1000)), str(KEEPALIVE_CHECKS), WATCHDOG]


def relay_command(fifo: str, directory: str = OUT_DIR) -> list[str]:
    """The argv of the output relay for FIFO ``fifo`` ("o" or "e") in ``directory``."""
    return ["sh", "-c", RELAY, "orchard-relay", directory, fifo]


def timer_args(ttl: float, attach_grace: float) -> list[str]:
    """The self-destruct timer's arguments: the attach grace (the wait for a shell; a
    controller killed before attaching leaves nothing running for long), the rest of the
    TTL (waited only once a shell has attached), the shell's pid file."""
    total = max(1, math.ceil(ttl))
    grace = min(total, math.ceil(attach_grace))
    return [str(grace), str(total - grace), SHELL_PID]


def preamble(workdir: str, writable_dirs: tuple[str, ...] = ()) -> str:
    """What the exec's shell runs before the server script (it then becomes the server): the
    directories it and the commands need (``spec.writable_dirs`` among them), and its pid for
    the timer."""
    dirs = " ".join(quote(d) for d in (CTL_DIR, workdir, *writable_dirs))
    return f"mkdir -p -- {dirs} && echo $$ >{quote(SHELL_PID)} || {{ echo {SETUP_FAILED} >&2; exit 1; }}\n"


async def attached_relays(split: SplitRelay, *, mount: str, where: str = "") -> tuple[OutputStream, OutputStream]:
    """``open_relays`` for relays in the main process (RELAYS_IN_MAIN): wait for them to be
    ready; ConfigError when they could not make their FIFOs (the image's doing)."""
    try:
        with anyio.fail_after(READY_TIMEOUT):
            await split.ready()
    except TimeoutError:
        await split.close()
        raise CreateFailed(f"the output relays{where} did not start (TimeoutError)") from None
    except RelaysFailed as exc:  # the image's doing: retrying cannot help
        await split.close()
        raise ConfigError(
            f"the sandbox could not create its output FIFO in {OUT_DIR}: {exc}; "
            f"the image's user must be able to write /tmp (read_only=True mounts {mount} there)"
        ) from None
    except (anyio.BrokenResourceError, anyio.EndOfStream) as exc:
        await split.close()
        raise CreateFailed(f"the output relays{where} did not start ({exc or type(exc).__name__})") from None
    return split.sides


def container_sandbox(
    name: str,
    client: ShellClient,
    labels: dict[str, str],
    expires_at: float,
    *,
    teardown: Callable[[], Awaitable[None]],
    open_stream: StreamOpener,
    network: NetworkSwitch | None = None,
    ttl_extender: Callable[[float], Awaitable[None]] | None = None,
    max_extension: float = 0.0,
    ttl_refusal: str = "",
) -> ShellSandbox:
    """A container's sandbox: the shell client at the container's root, closed by
    ``teardown``, its streams opened by ``open_stream`` (an exec per stream), its egress
    switched by ``network``, its expiry moved by ``ttl_extender`` (up to ``max_extension``
    seconds in all; ``ttl_refusal``: why it cannot be)."""
    return ShellSandbox(
        id=name,
        client=client,
        root="/",
        labels=labels,
        on_close=teardown,
        expires_at=expires_at,
        stream_opener=open_stream,
        network=network,
        ttl_extender=ttl_extender,
        max_extension=max_extension,
        ttl_refusal=ttl_refusal,
    )


async def concurrently(*calls: Callable[[], Awaitable[object]]) -> None:
    """Every call at once, until all have returned (a task group)."""
    async with anyio.create_task_group() as group:
        for call in calls:
            group.start_soon(call)


# -- the bootstrap --------------------------------------------------------------------------------

OpenOutput = Callable[[list[str]], Awaitable[OutputStream]]


def session_pipes(open_output: OpenOutput | SplitRelay | None) -> str:
    """Where a session's output FIFOs live. Relays run as execs get a directory of their own
    per session: a controller killed while it started them can leave one that the daemon
    starts only after the session's end had killed its processes, a reader of the old FIFOs
    that would take every other command's output from the next session's relay. The relays
    in a container's main process serve its one session, in OUT_DIR."""
    if open_output is None or isinstance(open_output, SplitRelay):
        return OUT_DIR
    return f"{OUT_DIR}/{secrets.token_hex(6)}"


async def open_relays(
    open_output: OpenOutput, pipes: str = OUT_DIR, *, mount: str, where: str = ""
) -> tuple[OutputStream, OutputStream]:
    """The two output relays (stdout, stderr; see RELAY) on the FIFOs in ``pipes``, opened at
    once, each ready. ``mount``
    names what a read-only root gets on /tmp (for the message when the image cannot write
    there), ``where`` the sandbox in messages. On failure none stays open."""
    relays: dict[str, OutputStream] = {}
    errors: list[Exception] = []

    async def open_relay(fifo: str) -> None:
        try:
            relay = await open_output(relay_command(fifo, pipes))
        except (CreateFailed, BackendUnavailable) as exc:
            errors.append(exc)
            return
        relays[fifo] = relay
        try:
            with anyio.fail_after(READY_TIMEOUT):
                await relay.ready(fifo)
        except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
            why = relay.stderr_tail.decode(errors="replace").strip()
            if why:  # it could not make its FIFO: the image's doing, not the backend's
                errors.append(
                    ConfigError(
                        f"the sandbox could not create its output FIFO in {OUT_DIR}: {why}; "
                        f"the image's user must be able to write /tmp (read_only=True mounts {mount} there)"
                    )
                )
            else:
                errors.append(CreateFailed(f"the output relay{where} did not start ({type(exc).__name__})"))

    # errors are collected, not raised, so that they do not leave the task group wrapped in
    # an exception group
    try:
        async with anyio.create_task_group() as group:
            for fifo in ("o", "e"):
                group.start_soon(open_relay, fifo)
        if errors:
            raise errors[0]
    except BaseException:
        await close_streams(list(relays.values()))
        raise
    return relays["o"], relays["e"]


async def start_shell(
    stream: anyio.abc.ByteStream,
    *,
    workdir: str,
    open_output: OpenOutput | SplitRelay | None,
    interrupt: Callable[[ShellClient], Awaitable[None]],
    output_cap: int,
    mount: str,
    where: str = "",
    writable_dirs: tuple[str, ...] = (),
) -> tuple[CgroupShellClient, list[OutputStream]]:
    """Bootstrap the shell-session server on a fresh shell exec (``shell_command``): the
    preamble, the output relays (none without ``open_output``: the protocol's spool mode;
    a SplitRelay: relays the container's main process runs), the server. Returns the client and the relays (the caller closes them with the
    sandbox); on failure closes everything and raises ConfigError when the image is at
    fault (a workdir its user cannot create), else CreateFailed."""
    stderr = lambda: getattr(stream, "stderr_tail", b"").decode(errors="replace")  # noqa: E731
    relays: tuple[OutputStream, OutputStream] | None = None
    pipes = session_pipes(open_output)
    try:
        await stream.send(preamble(workdir, writable_dirs).encode())
        if open_output is not None:
            try:
                if isinstance(open_output, SplitRelay):
                    relays = await attached_relays(open_output, mount=mount, where=where)
                else:
                    relays = await open_relays(open_output, pipes, mount=mount, where=where)
            except (ConfigError, CreateFailed):
                # A shell whose preamble failed ends the container, relays and all: its
                # reason is the one to give.
                ended: Callable[[], Awaitable[Any]] | None = getattr(stream, "ended", None)
                if ended is not None:
                    with anyio.move_on_after(5):
                        await ended()
                if SETUP_FAILED not in stderr():
                    raise
                raise SandboxLost("the sandbox shell did not start") from None
        client = CgroupShellClient(
            stream,
            workdir=workdir,
            interrupt=interrupt,
            output_cap=output_cap,
            output_pipes=pipes if relays else None,
            output_relays=relays,
        )
        await client.start(CTL_DIR)
    except (SandboxLost, anyio.BrokenResourceError) as exc:
        await close_streams([stream, *(relays or ())])
        why = stderr()
        if SETUP_FAILED in why:  # the image, not the backend: retrying cannot help
            raise ConfigError(
                f"the sandbox could not create {', '.join((workdir, *writable_dirs))} and {CTL_DIR}: "
                f"{why.replace(SETUP_FAILED, '').strip()}; choose a workdir (and writable_dirs) the image's user "
                f"can write (read_only=True mounts {mount} there)"
            ) from None
        raise CreateFailed(f"the sandbox shell{where} did not start: {why.strip() or exc}") from None
    except BaseException:
        await close_streams([stream, *(relays or ())])
        raise
    return client, list(relays or ())


# -- reap ---------------------------------------------------------------------------------------


def is_abandoned(
    labels: dict[str, str],
    *,
    ended: bool,
    controller_alive: bool | None,
    now: float,
    older_than: float,
    extended_to: float = 0.0,
) -> bool:
    """Whether ``reap`` removes a sandbox: it ended and was not removed (of no use to anyone),
    its TTL (its labels', or ``extended_to`` when an extension moved it later) passed
    ``older_than`` seconds ago, or its controller is known to be dead (a controller this host
    cannot see, None, leaves it to the expiry; a sandbox with a reattach grace waits for a new
    controller, and ends itself when none comes)."""
    if ended or max(expiry(labels), extended_to) + older_than < now:
        return True
    # one made to outlive its controller ends itself when nobody attaches within its grace
    return controller_alive is False and REATTACH not in labels

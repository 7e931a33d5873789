"""The shell-session protocol: the hot path of every adapter.

One long-lived POSIX ``sh`` per sandbox reads *frames* from its stdin. A frame is a
single call ``_o_x NONCE HEAD TAIL SESSION 'cwd' 'env' 'cmd' 'stdin-b64'``
whose arguments are single-quoted shell literals, so the shell's own parser does the
input framing: any byte but NUL survives, and nothing in a command can end a frame
early. The server runs each command in a fresh subshell (one fork, no exec: this is
what keeps a round trip near a millisecond) and sends back::

    @@ORCH <nonce> <exit code> <timed out 0|1> <stdout size> <stderr size>\\n
    <stdout payload><stderr payload>@@END <nonce>\\n

Each payload is the whole stream when it fits ``HEAD + TAIL`` bytes, otherwise its
first HEAD and last TAIL bytes; the client knows both numbers, so it reads exact
lengths and never scans output for a delimiter. The nonce only checks that client and
server agree on where a frame starts.

Timeouts are the client's: when one passes it *interrupts* the server (SIGUSR1, sent
by the adapter over a side channel: ``os.kill`` locally, a second exec in a container),
and the server freezes and kills the command's whole process tree, then answers the
frame as usual with the timed-out flag set. So no watcher process is paid per command.

The client speaks to the server over any anyio ``ByteStream``: local pipes, a Docker
attach stream, a Kubernetes exec websocket. Only ``sh``, ``head -c``, ``tail -c``,
``wc``, ``sleep``, ``kill``, ``base64`` (for stdin and binary files) and a Linux
``/proc`` are needed in the image; busybox has all of them.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import fcntl
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.abc
import msgspec
from anyio.streams.buffered import BufferedByteReceiveStream

from orchard_async.errors import ConfigError, SandboxLost
from orchard_async.protocols import DEFAULT_EXEC_TIMEOUT
from orchard_async.types import DEFAULT_OUTPUT_CAP, ExecResult, ExitReason, check_env, check_timeout

# The server. `$1` is its control dir (scratch files; never the agent's work dir).
# Every name is prefixed `_o_` because commands run in subshells that can see them.
# Lifetime (TTL, cleanup) is the adapter's business: a container's main process, or the
# local adapter's supervisor. The server only kills what it started when it ends.
T = TypeVar("T")

SERVER_SCRIPT = r"""
_o_C=$1; _o_O=${2:-$1}; _o_M=${3:-}; _o_busy=0; _o_p=; _o_t=0
exec 2>>"$_o_C/shell.log"
# Kill a process and all its descendants; each is frozen first so it cannot fork away.
_o_tree() {
  local _o_ch _o_c
  kill -STOP "$1" 2>/dev/null || return 0
  read -r _o_ch <"/proc/$1/task/$1/children" 2>/dev/null
  for _o_c in $_o_ch; do _o_tree "$_o_c"; done
  kill -KILL "$1" 2>/dev/null
}
_o_children() {
  local _o_ch _o_c
  read -r _o_ch <"/proc/$$/task/$$/children" 2>/dev/null
  for _o_c in $_o_ch; do _o_tree "$_o_c"; done
}
_o_end() { trap - EXIT; _o_children; }
# The client's timeout: it signals USR1 while a command runs (wait returns at once).
_o_int() { if [ "$_o_busy" = 1 ]; then _o_t=1; _o_tree "$_o_p"; fi; }
trap _o_end EXIT
trap 'exit 143' TERM HUP INT
trap _o_int USR1
_o_size() { if [ -s "$1" ]; then _o_n=$(wc -c <"$1"); _o_n=$((_o_n)); else _o_n=0; fi; }
_o_send() {
  if [ "$2" -le $(($3 + $4)) ]; then if [ "$2" -gt 0 ]; then head -c "$2" "$1"; fi
  else head -c "$3" "$1"; tail -c "$4" "$1"; fi
}
_o_x() {
  _o_in=/dev/null; _o_t=0
  if [ -n "$8" ]; then printf %s "$8" | base64 -d >"$_o_C/i"; _o_in=$_o_C/i; fi
  if [ -n "$4" ]; then
    (_o_st=$_o_C/s.$4 _o_cwd=$5 _o_env=$6 _o_cmd=$7; set --; trap - USR1; set -a
     cd -- "$_o_cwd" || exit 126
     if [ -f "$_o_st" ]; then . "$_o_st"; fi
     trap 'export -p >"$_o_st"; echo "cd -- \"\$PWD\"" >>"$_o_st"' EXIT
     eval "$_o_env"; eval "$_o_cmd") <"$_o_in" >"$_o_O/o" 2>"$_o_O/e" &
  else
    (_o_cwd=$5 _o_env=$6 _o_cmd=$7; set --; trap - USR1
     cd -- "$_o_cwd" || exit 126; eval "$_o_env"; eval "$_o_cmd") <"$_o_in" >"$_o_O/o" 2>"$_o_O/e" &
  fi
  _o_w "$1" "$2" "$3"
}
# Wait for the command just started in the background ($!) and answer its frame.
# A function of its own so that a bash lane (orchard_async.apps.serve.lane) can start the
# command at the top level, outside any function, and still answer the same way.
_o_w() {
  _o_p=$!; _o_busy=1
  wait "$_o_p"; _o_rc=$?
  while [ "$_o_rc" -gt 128 ] && kill -0 "$_o_p" 2>/dev/null; do wait "$_o_p"; _o_rc=$?; done
  _o_busy=0
  if [ -n "$_o_M" ]; then printf '@@EOO %s\n' "$1" >>"$_o_O/o"; printf '@@EOO %s\n' "$1" >>"$_o_O/e"; fi
  _o_size "$_o_O/o"; _o_os=$_o_n; _o_size "$_o_O/e"; _o_es=$_o_n
  printf '@@ORCH %s %s %s %s %s\n' "$1" "$_o_rc" "$_o_t" "$_o_os" "$_o_es"
  _o_send "$_o_O/o" "$_o_os" "$2" "$3"; _o_send "$_o_O/e" "$_o_es" "$2" "$3"
  printf '@@END %s\n' "$1"
}
printf '@@READY %s\n' $$
"""

READY_TIMEOUT = 30.0
FRAME_GRACE = 10.0  # beyond a command's own timeout, before the sandbox counts as lost
INTERRUPT_GRACE = 1.0  # for the interrupt of a cancelled command (a container's takes an exec)


def quote(value: str) -> str:
    """A single-quoted sh literal: every byte but NUL stands for itself."""
    if "\0" in value:
        raise ConfigError("commands, paths and environment values cannot contain NUL bytes")
    return "'" + value.replace("'", "'\\''") + "'"


def env_prelude(env: dict[str, str] | None) -> str:
    check_env(env)
    if not env:
        return ""
    return "export " + " ".join(f"{key}={quote(val)}" for key, val in env.items())


def cut_marker(dropped: int) -> bytes:
    return b"\n[orchard: %d bytes cut]\n" % dropped


SIGKILLED = 128 + 9


def classify(exit_code: int, timed_out: bool) -> ExitReason:
    """sh reports death by signal N as 128+N, and cannot tell `exit 137` from a SIGKILL;
    137 reads as killed, since a command rarely chooses it and the OOM killer often does.
    Adapters that can see the cgroup refine KILLED to OOM."""
    if timed_out:
        return ExitReason.TIMEOUT
    if exit_code == SIGKILLED:
        return ExitReason.KILLED
    return ExitReason.OK if exit_code == 0 else ExitReason.NONZERO


F_SETPIPE_SZ = 1031  # fcntl: a pipe's buffer size (Linux)
PIPE_BUFFER = 1 << 20
DRAIN_LIMIT = 4 * PIPE_BUFFER  # what one drain reads at most: a writer that never stops cannot hold it


def make_output_pipes(directory: str, owner: tuple[int, int] | None = None) -> None:
    """The FIFOs a client in pipe mode reads a command's stdout (``o``) and stderr (``e``) from.
    Only the sandbox's user may write them (``owner``: its uid and gid, when not the caller's)."""
    for name in ("o", "e"):
        path = os.path.join(directory, name)
        os.mkfifo(path, 0o600)
        if owner is not None:
            os.chown(path, *owner)


class PipeCapture:
    """One output FIFO the client reads itself while the command runs: the first ``head``
    bytes, the last ``tail`` bytes and a count of the rest, and nothing on any disk.

    The client also holds the FIFO open for writing, so the FIFO never reads as ended between
    commands (no busy wakeups) and a command can open it without waiting."""

    needs_pump = True  # a task must keep the FIFO flowing while a command runs

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._hold = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._loop: asyncio.AbstractEventLoop | None = None
        try:
            fcntl.fcntl(self.fd, F_SETPIPE_SZ, PIPE_BUFFER)
        except OSError:
            pass  # the default 64 KiB buffer works, with more wakeups
        self.reset(0, 0)

    def _watch(self) -> None:
        """Under asyncio, the loop drains the FIFO whenever it has data, between commands
        too: no task per command (the hot path), and a background writer never blocks.
        Between commands the data is only counted (head and tail are zero then)."""
        if self._loop is not None:
            return
        try:
            loop = asyncio.get_running_loop()  # none under trio: there a task pumps per command
            loop.add_reader(self.fd, self._on_readable)
        except (RuntimeError, NotImplementedError):
            return
        self._loop = loop
        self.needs_pump = False

    def _on_readable(self) -> None:
        try:
            self.drain()
        except OSError:
            self._unwatch()

    def _unwatch(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.fd)
            self._loop = None

    def reset(self, head: int, tail: int) -> None:
        self.head_max, self.tail_max = head, tail
        self.first = bytearray()
        self.last = bytearray()
        self.size = 0

    def drain(self) -> None:
        """Read what the FIFO holds now, up to DRAIN_LIMIT bytes."""
        taken = 0
        while taken < DRAIN_LIMIT:
            try:
                chunk = os.read(self.fd, PIPE_BUFFER)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not chunk:
                return
            taken += len(chunk)
            self._keep(chunk)

    def _keep(self, chunk: bytes) -> None:
        self.size += len(chunk)
        room = self.head_max - len(self.first)
        if room > 0:
            self.first += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_max:
            self.last += chunk
            if len(self.last) > 2 * self.tail_max:
                del self.last[: -self.tail_max]

    def begin(self, head: int, tail: int) -> None:
        self._watch()
        self.drain()  # what background processes wrote since the last command
        self.reset(head, tail)

    async def pump(self, nonce: str) -> None:
        """Keep the FIFO flowing while the command runs (a full one would block it)."""
        try:
            while True:
                self.drain()
                await anyio.wait_readable(self.fd)
        except OSError:
            return  # the FIFO is gone (the client is closing); the frame decides the outcome

    async def finish(self) -> None:
        """The command has ended, so all it wrote is in the FIFO now."""
        self.drain()

    def result(self) -> tuple[bytes, int]:
        """The command's output; the capture keeps nothing more until the next command."""
        first, last = bytes(self.first), bytes(self.last[-self.tail_max :]) if self.tail_max else b""
        size, fits = self.size, self.size <= self.head_max + self.tail_max
        self.reset(0, 0)
        if fits:
            return first + last, 0
        dropped = size - len(first) - len(last)
        return first + cut_marker(dropped) + last, dropped

    def close(self) -> None:
        self._unwatch()
        for fd in (self.fd, self._hold):
            try:
                os.close(fd)
            except OSError:
                pass


class StreamCapture(PipeCapture):
    """An output FIFO inside a sandbox the client cannot open itself (a container), relayed
    by a process in the sandbox that copies it to a stream (``cat <>FIFO`` over an exec):
    the server ends each command's output with ``@@EOO <nonce>``, so the client knows when
    it has all of it."""

    def __init__(self, stream: anyio.abc.ByteReceiveStream):
        self.stream = stream
        self.carry = bytearray()  # received past the last marker: the next command's
        self.done = anyio.Event()
        self.reset(0, 0)

    def begin(self, head: int, tail: int) -> None:
        self.reset(head, tail)
        self.done = anyio.Event()

    async def pump(self, nonce: str) -> None:
        marker = b"@@EOO " + nonce.encode() + b"\n"
        try:
            while True:
                found = self.carry.find(marker)
                if found >= 0:
                    self._keep(bytes(self.carry[:found]))
                    del self.carry[: found + len(marker)]
                    self.done.set()
                    return
                keep = len(marker) - 1  # the tail of the buffer may be a marker's beginning
                if len(self.carry) > keep:
                    self._keep(bytes(self.carry[:-keep]))
                    del self.carry[:-keep]
                self.carry += await self.stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return  # the relay is gone: finish() times out and the sandbox counts as lost

    async def finish(self) -> None:
        with anyio.fail_after(FRAME_GRACE):
            await self.done.wait()

    def close(self) -> None:
        pass  # the adapter owns the relay streams


STREAM_ERRORS = (
    TimeoutError,
    anyio.EndOfStream,
    anyio.IncompleteRead,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)


async def _caught(exchange: Awaitable[T]) -> T | BaseException:
    """The exchange's result, or the stream error it raised: returned, not raised, so that a
    task group around it (the output pumps) does not wrap it in an exception group."""
    try:
        return await exchange
    except STREAM_ERRORS as exc:
        return exc


class ShellClient:
    """Drives one server over a byte stream. Commands on one shell run one at a time.

    Output reaches the client one of two ways. By default the server spools a command's
    output to files in its control dir and sends it in the frame. In pipe mode
    (``output_pipes``: a directory the client and the sandbox both see at that path, with
    FIFOs from ``make_output_pipes``; the local adapter) the command writes into FIFOs the
    client reads while it runs: nothing is spooled, so output cannot fill a disk, and the
    server never reads it back."""

    def __init__(
        self,
        stream: anyio.abc.ByteStream,
        *,
        workdir: str,
        interrupt: Callable[[ShellClient], Awaitable[None]],
        output_cap: int = DEFAULT_OUTPUT_CAP,
        output_pipes: str | None = None,
        output_relays: tuple[anyio.abc.ByteReceiveStream, anyio.abc.ByteReceiveStream] | None = None,
    ):
        self._stream = stream
        self._interrupt = interrupt
        self._reader = BufferedByteReceiveStream(stream)
        self._lock = anyio.Lock()
        self.workdir = workdir
        self.head = output_cap // 2
        self.tail = output_cap - self.head
        self.server_pid = 0  # as the sandbox sees it
        self.lost: str | None = None  # why the shell is unusable, once it is
        self.ctl_dir = ""
        self.output_pipes = output_pipes
        self.output_relays = output_relays
        self._captures: list[PipeCapture] = []

    async def start(self, ctl_dir: str) -> None:
        """Send the server script to a waiting ``sh -s`` and wait for it to answer."""
        self.ctl_dir = ctl_dir
        args = f"set -- {quote(ctl_dir)}\n"
        if self.output_pipes and self.output_relays:
            self._captures = [StreamCapture(relay) for relay in self.output_relays]
            args = f"set -- {quote(ctl_dir)} {quote(self.output_pipes)} mark\n"
        elif self.output_pipes:
            self._captures = [PipeCapture(os.path.join(self.output_pipes, name)) for name in ("o", "e")]
            args = f"set -- {quote(ctl_dir)} {quote(self.output_pipes)}\n"
        await self._stream.send(self.startup(args).encode())
        try:
            with anyio.fail_after(READY_TIMEOUT):
                line = await self._reader.receive_until(b"\n", 4096)
                while not line.startswith(b"@@READY "):
                    line = await self._reader.receive_until(b"\n", 4096)
        except (TimeoutError, anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError) as exc:
            raise SandboxLost(f"the sandbox shell did not start ({type(exc).__name__})") from None
        self.server_pid = int(line.split()[1])

    async def run(
        self,
        cmd: str,
        *,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,  # the one meaning of protocols.py
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
        session: str = "",
        uncapped: bool = False,
    ) -> ExecResult:
        check_timeout(timeout)
        head, tail = (1 << 62, 0) if uncapped else (self.head, self.tail)
        nonce = secrets.token_hex(8)
        frame = self.frame(
            [
                nonce,
                str(head),
                str(tail),
                quote(session),
                quote(cwd or self.workdir),
                quote(env_prelude(env)),
                quote(cmd),
                quote(base64.b64encode(stdin).decode() if stdin else ""),
            ]
        )
        try:
            data = frame.encode() + b"\n"
        except UnicodeEncodeError:
            raise ConfigError(
                "commands, paths and environment values must be valid text (no lone surrogates)"
            ) from None
        async with self._lock:
            started = time.perf_counter()
            if self.lost:
                return self._lost_result(started)
            try:
                for capture in self._captures:
                    capture.begin(head, tail)
                await self._stream.send(data)
                if any(capture.needs_pump for capture in self._captures):
                    async with anyio.create_task_group() as pumps:
                        for capture in self._captures:
                            pumps.start_soon(capture.pump, nonce)
                        outcome = await _caught(self._exchange(nonce, timeout, head, tail))
                        if not isinstance(outcome, BaseException):
                            finished = await _caught(self._finish_captures())
                            outcome = finished if isinstance(finished, BaseException) else outcome
                        pumps.cancel_scope.cancel()
                else:
                    outcome = await _caught(self._exchange(nonce, timeout, head, tail))
                    if self._captures and not isinstance(outcome, BaseException):
                        finished = await _caught(self._finish_captures())
                        outcome = finished if isinstance(finished, BaseException) else outcome
                if isinstance(outcome, BaseException):
                    raise outcome
                code, timed_out, out, out_cut, err, err_cut = outcome
                if self._captures:
                    (out, out_cut), (err, err_cut) = (capture.result() for capture in self._captures)
            except anyio.get_cancelled_exc_class():
                # The caller gave up on the command (an aborted or cancelled episode): stop it
                # now, so closing the sandbox does not wait for it to end by itself. Its frame
                # is never read: the shell is out of step with this client from here on.
                self.lost = "a command was cancelled"
                try:
                    with anyio.move_on_after(INTERRUPT_GRACE, shield=True):
                        while True:  # again until it answers: a signal sent before the command began is lost
                            await self._interrupt(self)
                            with anyio.move_on_after(0.05):
                                await self._read_header(nonce)
                                break
                except Exception:  # noqa: BLE001 - the shell is gone already: nothing left to stop
                    pass
                raise
            except TimeoutError:
                self.lost = "the sandbox shell stopped answering"
                return self._lost_result(started)
            except STREAM_ERRORS:
                self.lost = "the sandbox shell is gone"
                return self._lost_result(started)
            return ExecResult(
                exit_code=code,
                reason=classify(code, timed_out),
                stdout=out,
                stderr=err,
                duration=time.perf_counter() - started,
                stdout_cut=out_cut,
                stderr_cut=err_cut,
            )

    async def ping(self, timeout: float) -> bool:
        """Whether the server answers, without running a command: one line it answers itself
        (``printf`` is a builtin: no fork, no output relays), the cheapest round trip that
        still goes through the sandbox's own shell. False when it does not answer within
        ``timeout`` or its stream is gone (then the client is lost, as a command would
        find). An answer that comes too late is skipped by the next command's header read.
        Speaks the plain server's line framing (not a subclass's, such as a bash lane's)."""
        nonce = secrets.token_hex(8)
        answer = f"@@PONG {nonce}".encode()
        async with self._lock:
            if self.lost:
                return False
            try:
                with anyio.fail_after(timeout):
                    await self._stream.send(f"printf '@@PONG %s\\n' {nonce}\n".encode())
                    while await self._reader.receive_until(b"\n", 4096) != answer:
                        pass  # stray bytes: skip to the answer
            except TimeoutError:
                return False
            except STREAM_ERRORS:
                self.lost = "the sandbox shell is gone"
                return False
        return True

    def startup(self, args: str) -> str:
        """What start() sends: the server's arguments (a ``set --`` line), then its script.
        A subclass may wrap it (orchard_async.apps.serve.lane)."""
        return args + SERVER_SCRIPT

    def frame(self, args: list[str]) -> str:
        """The line that runs one command: a call of the server's ``_o_x`` with the quoted
        arguments (a subclass may send another shape; see orchard_async.apps.serve.lane)."""
        return "_o_x " + " ".join(args)

    async def _finish_captures(self) -> None:
        for capture in self._captures:
            await capture.finish()

    async def _exchange(
        self, nonce: str, timeout: float | None, head: int, tail: int
    ) -> tuple[int, bool, bytes, int, bytes, int]:
        """Wait for the command's frame (interrupting it at its timeout) and read it."""
        with anyio.move_on_after(timeout) as deadline:
            header = await self._read_header(nonce)
        if deadline.cancelled_caught:
            await self._interrupt(self)
            with anyio.fail_after(FRAME_GRACE):
                header = await self._read_header(nonce)
        with anyio.fail_after(FRAME_GRACE + (header[2] + header[3]) / 1e6):  # time to move the payload
            return await self._read_body(nonce, header, head, tail)

    async def _read_header(self, nonce: str) -> tuple[int, bool, int, int]:
        line = await self._reader.receive_until(b"\n", 4096)
        while not line.startswith(b"@@ORCH "):
            line = await self._reader.receive_until(b"\n", 4096)  # stray bytes: resync on the header
        _, got_nonce, code, timed_out, out_size, err_size = line.decode().split()
        if got_nonce != nonce:
            raise anyio.BrokenResourceError(f"frame out of sync: expected {nonce}, got {got_nonce}")
        return int(code), timed_out == "1", int(out_size), int(err_size)

    async def _read_body(
        self, nonce: str, header: tuple[int, bool, int, int], head: int, tail: int
    ) -> tuple[int, bool, bytes, int, bytes, int]:
        code, timed_out, out_size, err_size = header
        out, out_cut = await self._read_payload(out_size, head, tail)
        err, err_cut = await self._read_payload(err_size, head, tail)
        trailer = await self._reader.receive_until(b"\n", 4096)
        if trailer != b"@@END " + nonce.encode():
            raise anyio.BrokenResourceError("frame trailer missing")
        return code, timed_out, out, out_cut, err, err_cut

    async def _read_payload(self, size: int, head: int, tail: int) -> tuple[bytes, int]:
        if size == 0:
            return b"", 0
        if size <= head + tail:
            return await self._reader.receive_exactly(size), 0
        first = await self._reader.receive_exactly(head)
        last = await self._reader.receive_exactly(tail)
        dropped = size - head - tail
        return first + cut_marker(dropped) + last, dropped

    def _lost_result(self, started: float) -> ExecResult:
        return ExecResult(
            exit_code=-1,
            reason=ExitReason.SANDBOX_LOST,
            stderr=(self.lost or "").encode(),
            duration=time.perf_counter() - started,
        )

    async def close(self) -> None:
        self.lost = self.lost or "the sandbox was closed"
        with anyio.CancelScope(shield=True):
            await self._stream.aclose()
        for capture in self._captures:
            capture.close()
        self._captures = []


# Reads the memory cgroup's OOM-kill counter (cgroup v1, then v2); prints nothing elsewhere.
OOM_PROBE = (
    "for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do "
    'if [ -r "$f" ]; then while read -r k v; do if [ "$k" = oom_kill ]; then echo "$v"; fi; done <"$f"; fi; '
    "done"
)


class CgroupShellClient(ShellClient):
    """The shell client, plus the refinement only a container can make: a command that
    ended with 137 (SIGKILL) while the memory cgroup's OOM-kill counter rose was killed for
    memory. Exit code 137 rather than reason KILLED: the OOM killer picks the biggest
    process, often a child of the command's shell, which then exits 137 itself. The counter
    is read only after such an exit (never on the hot path) and compared with the last value
    seen; a fresh container's cgroup starts at zero."""

    oom_kills_seen = 0

    async def run(self, cmd: str, **options: Any) -> ExecResult:
        result = await super().run(cmd, **options)
        if result.exit_code == SIGKILLED and result.reason in (ExitReason.KILLED, ExitReason.NONZERO):
            if await self._oom_counter_rose():
                result = msgspec.structs.replace(result, reason=ExitReason.OOM)
        return result

    async def _oom_counter_rose(self) -> bool:
        probe = await super().run(OOM_PROBE, timeout=10)
        counts = [int(word) for word in probe.text.split() if word.isdigit()]
        if not counts:
            return False  # no memory cgroup to read: leave the reason as killed
        rose, self.oom_kills_seen = counts[0] > self.oom_kills_seen, counts[0]
        return rose

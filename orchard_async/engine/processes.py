"""A rollout spread over worker processes: one event loop per core.

``rollout`` drives every episode on one event loop, so its own CPU (each step's recording,
each episode's start and end) is bounded by one core. At a sampler's rate of about 10,000
steps/s (1,024 episodes at a 100 ms engine latency) that core is half busy, and the episodes'
starts and ends, which come in bursts, make the sampler wait (``bench turnaround``,
docs/performance.md). ``ProcessRollout`` runs the same plan in N processes (``python -c``,
this module's ``main``), each a ``rollout`` of its share, and yields every trajectory to the
caller as ``rollout`` does. A trainer's own loop then only receives them.

* The plan is the one ``rollout`` makes (the same episode ids, so ``skip`` resumes it); each
  worker runs the GRPO groups whose index is its own modulo N, so a group, and the setup
  its samples fork from, stays in one worker. The concurrency is split as evenly.
* A worker cannot be handed live objects (a policy's engine client, an adapter's
  connections), so it is handed a *build*: ``"module:function"`` and JSON-able keyword
  arguments. In each worker, ``function(**options)`` returns a ``Workload`` (tasks, policy,
  adapter), the same in every worker; the worker closes the policy and the adapter when done.
* Every worker builds its workload first; the run starts in all of them at once when the
  last is ready (``started``: from then on, a worker's start-up is not the run's).
* Ending the iteration early (``break``, Ctrl-C, a cancelled task) closes the workers'
  stdin: each cancels its rollout, whose sandboxes are closed on the way out, and exits.
  A worker that dies takes its unfinished episodes with it: the iteration raises once the
  others are done, naming how many did not come back (run again with ``skip``).
* Not with a trainer's ``RolloutControl`` (abort, grow, pause): its handle is one process's.

Frames on the pipes: 4 bytes of length, a kind byte, a msgpack body. To a worker (stdin): its
``Assignment``, then one ``GO``. From a worker (stdout): ``READY`` (its episode count), a
``TRAJECTORY`` per episode, then ``DONE`` (its workload's report, or nil) or ``FAILED`` (why).
A worker's stderr is the caller's (its logs).
"""

from __future__ import annotations

import inspect
import math
import os
import pkgutil
import struct
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import anyio
import anyio.abc
import msgspec
from anyio.streams.buffered import BufferedByteReceiveStream

from orchard_async.engine.plan import Episode, episode_count, plan
from orchard_async.engine.rollout import rollout
from orchard_async.errors import ConfigError, OrchardError
from orchard_async.protocols import Adapter, Policy, Task
from orchard_async.records.trajectory import Trajectory

ASSIGNMENT, GO, READY, TRAJECTORY, DONE, FAILED = b"A", b"G", b"R", b"T", b"D", b"F"
HEADER = struct.Struct(">I")
# A worker's command (not ``-m``: run as __main__, this module would be a second copy of itself)
WORKER = "import sys; from orchard_async.engine.processes import main; sys.exit(main())"
STOP_GRACE = 30.0  # seconds a worker has to close its sandboxes once told to stop, before it is killed


@dataclass
class Workload:
    """What a worker runs: a build function returns one (see the module docstring)."""

    tasks: Sequence[Task]
    policy: Policy
    adapter: Adapter
    # called (and awaited, if it is a coroutine) once the worker's share is done, before the
    # adapter closes; what it returns (msgpack-able) is in ProcessRollout.reports
    report: Callable[[], Any] | None = None


class Assignment(msgspec.Struct, kw_only=True):
    build: str
    options: dict[str, Any]
    worker: int
    workers: int
    concurrency: int
    n: int | None
    group_size: int
    max_retries: int
    skip: list[str]
    run_id: str
    warm: int | None


def share(episodes: Sequence[Episode], worker: int, workers: int) -> list[Episode]:
    """The episodes of the groups whose index in the plan is ``worker`` modulo ``workers``."""
    groups: dict[str, int] = {}
    return [ep for ep in episodes if groups.setdefault(ep.group_id, len(groups)) % workers == worker]


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` shares that differ by at most one."""
    return [total // parts + (index < total % parts) for index in range(parts)]


class ProcessRollout:
    """``rollout`` in ``processes`` worker processes; iterate it for the trajectories (see the
    module docstring). ``reports``: each worker's workload report, once the iteration is done."""

    def __init__(
        self,
        build: str,
        options: dict[str, Any] | None = None,
        *,
        processes: int,
        concurrency: int = 8,
        n: int | None = None,
        group_size: int = 1,
        max_retries: int = 2,
        skip: Iterable[str] = (),
        run_id: str | None = None,
        warm: int | None = None,
    ):
        if ":" not in build:
            raise ConfigError(f"build must be 'module:function', got {build!r}")
        if processes < 1:
            raise ConfigError(f"processes must be at least 1, got {processes}")
        if concurrency < processes:
            raise ConfigError(f"concurrency ({concurrency}) must be at least the number of processes ({processes})")
        run_id = run_id or uuid.uuid4().hex[:12]  # one run: every worker's trajectories carry it
        self.assignments = [
            Assignment(
                build=build,
                options=dict(options or {}),
                worker=worker,
                workers=processes,
                concurrency=share_of,
                n=n,
                group_size=group_size,
                max_retries=max_retries,
                skip=sorted(skip),
                run_id=run_id,
                warm=warm,
            )
            for worker, share_of in enumerate(split(concurrency, processes))
        ]
        self.reports: list[Any] = [None] * processes
        self.started: float | None = None  # time.monotonic() just before every worker was told to go

    async def __aiter__(self) -> AsyncIterator[Trajectory]:
        processes: list[anyio.abc.Process] = []
        # the caller's import path, as multiprocessing's spawn passes it: the build's module resolves there too
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        try:
            for assignment in self.assignments:
                process = await anyio.open_process(
                    [sys.executable, "-c", WORKER], stdin=-1, stdout=-1, stderr=None, env=env
                )
                processes.append(process)
                await _send(process, ASSIGNMENT, msgspec.msgpack.encode(assignment))
            readers = [BufferedByteReceiveStream(_stdout(process)) for process in processes]
            expected = [await _ready(reader, index) for index, reader in enumerate(readers)]
            self.started = time.monotonic()  # before the first go: a worker may start at once
            for process in processes:
                await _send(process, GO, b"")
            send, receive = anyio.create_memory_object_stream[Trajectory](math.inf)  # bounded by the plan
            missing: list[str] = []
            async with anyio.create_task_group() as group:
                async with send:
                    for index, reader in enumerate(readers):
                        group.start_soon(self._read, reader, index, expected[index], send.clone(), missing)
                async with receive:
                    try:
                        async for trajectory in receive:
                            yield trajectory
                    except GeneratorExit:  # the caller stopped early: as rollout, end the readers quietly
                        group.cancel_scope.cancel()
                        missing.clear()  # not a failure: the workers are stopped below
            if missing:
                raise OrchardError("; ".join(missing) + "; run again with skip= the episodes received, for the rest")
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(processes)

    async def _read(
        self, reader: BufferedByteReceiveStream, index: int, expected: int, send: Any, missing: list[str]
    ) -> None:
        received = 0
        async with send:
            while True:
                kind, body = await _receive(reader)
                if kind == TRAJECTORY:
                    try:
                        await send.send(_decode_trajectory(body))
                    except anyio.BrokenResourceError:  # the caller stopped iterating
                        return
                    received += 1
                elif kind == DONE:
                    self.reports[index] = msgspec.msgpack.decode(body)
                    return
                else:
                    why = msgspec.msgpack.decode(body) if kind == FAILED else "it exited"
                    missing.append(
                        f"worker {index} stopped with {expected - received} of {expected} episodes not returned ({why})"
                    )
                    return


_decode_trajectory = msgspec.msgpack.Decoder(Trajectory).decode


def _stdout(process: anyio.abc.Process) -> anyio.abc.ByteReceiveStream:
    assert process.stdout is not None  # opened with a pipe
    return process.stdout


async def _send(process: anyio.abc.Process, kind: bytes, body: bytes) -> None:
    assert process.stdin is not None
    await process.stdin.send(HEADER.pack(len(body) + 1) + kind + body)


async def _receive(reader: BufferedByteReceiveStream) -> tuple[bytes, bytes]:
    """The next frame, or ``(b"", b"")`` when the worker's stdout ended."""
    try:
        (length,) = HEADER.unpack(await reader.receive_exactly(HEADER.size))
        frame = await reader.receive_exactly(length)
    except (anyio.EndOfStream, anyio.IncompleteRead):
        return b"", b""
    return frame[:1], frame[1:]


async def _ready(reader: BufferedByteReceiveStream, index: int) -> int:
    kind, body = await _receive(reader)
    if kind == READY:
        return int(msgspec.msgpack.decode(body))
    why = msgspec.msgpack.decode(body) if kind == FAILED else "it exited before it was ready (its stderr says why)"
    raise OrchardError(f"worker {index} could not start: {why}")


async def _stop(processes: list[anyio.abc.Process]) -> None:
    """Close each worker's stdin (it stops its rollout and closes its sandboxes), wait for
    them all, kill what is left after ``STOP_GRACE``."""
    for process in processes:
        if process.stdin is not None:
            await process.stdin.aclose()
    with anyio.move_on_after(STOP_GRACE):
        for process in processes:
            await process.wait()
    for process in processes:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.aclose()


# -- the worker ---------------------------------------------------------------------------


class FrameWriter:
    """A worker's frames to the caller on its stdout, written without blocking: a write to a
    pipe the caller has not emptied yet would stop the event loop, and every episode with it.
    ``send`` waits for the pipe instead, as ``rollout``'s own stream waits for its consumer."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)

    async def send(self, kind: bytes, body: bytes) -> None:
        view = memoryview(HEADER.pack(len(body) + 1) + kind + body)
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:
                await anyio.wait_writable(self.fd)

    def send_now(self, kind: bytes, body: bytes) -> None:
        """The same, blocking: outside the event loop (the worker's last word)."""
        os.set_blocking(self.fd, True)
        view = memoryview(HEADER.pack(len(body) + 1) + kind + body)
        while view:
            view = view[os.write(self.fd, view) :]


def _read_frame(source: BinaryIO) -> tuple[bytes, bytes]:
    """The next frame from the caller (blocking), or ``(b"", b"")`` at the end of the pipe."""
    header = _read_exactly(source, HEADER.size)
    if len(header) < HEADER.size:
        return b"", b""
    (length,) = HEADER.unpack(header)
    frame = _read_exactly(source, length)
    return (frame[:1], frame[1:]) if len(frame) == length else (b"", b"")


def _read_exactly(source: BinaryIO, size: int) -> bytes:
    data = b""
    while len(data) < size and (chunk := source.read(size - len(data))):
        data += chunk
    return data


_this_worker: tuple[int, int] | None = None


def this_worker() -> tuple[int, int] | None:
    """In a worker of a ``ProcessRollout`` (its build included): (its index, the number of
    workers), e.g. to pick one of several engine servers; None elsewhere."""
    return _this_worker


async def work(assignment: Assignment, source: BinaryIO, out: FrameWriter) -> None:
    """One worker's run (``main``, in the worker process)."""
    global _this_worker
    _this_worker = (assignment.worker, assignment.workers)
    build = pkgutil.resolve_name(assignment.build)
    workload = build(**assignment.options)
    if inspect.isawaitable(workload):
        workload = await workload
    if not isinstance(workload, Workload):
        raise ConfigError(f"{assignment.build} returned {type(workload).__name__}, not a Workload")
    try:
        episodes = plan(
            workload.tasks, episode_count(workload.tasks, assignment.n, assignment.group_size), assignment.group_size
        )
        mine = {ep.episode_id for ep in share(episodes, assignment.worker, assignment.workers)}
        skip = set(assignment.skip)
        others = [ep.episode_id for ep in episodes if ep.episode_id not in mine]
        await out.send(READY, msgspec.msgpack.encode(len(mine - skip)))
        await anyio.wait_readable(source.fileno())  # while the other workers build theirs
        if _read_frame(source)[0] != GO:
            return  # the caller went away before the start
        encode = msgspec.msgpack.Encoder().encode
        async with anyio.create_task_group() as group:

            async def stop_when_told() -> None:
                await anyio.wait_readable(source.fileno())  # the caller closed its end: stop
                group.cancel_scope.cancel()

            group.start_soon(stop_when_told)
            async for trajectory in rollout(
                workload.tasks,
                workload.policy,
                workload.adapter,
                n=assignment.n,
                group_size=assignment.group_size,
                concurrency=assignment.concurrency,
                max_retries=assignment.max_retries,
                skip=skip.union(others),
                run_id=assignment.run_id,
                warm=assignment.warm,
            ):
                await out.send(TRAJECTORY, encode(trajectory))
            report = workload.report() if workload.report is not None else None
            if inspect.isawaitable(report):
                report = await report
            await out.send(DONE, msgspec.msgpack.encode(report))
            group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            close = getattr(workload.policy, "close", None)
            if close is not None:
                await close()
            await workload.adapter.close()


def main() -> int:
    from orchard_async.engine.collector import tune_for_rollouts
    from orchard_async.runtime import run

    # The pipes to the caller on descriptors of their own (not inherited); 0 and 1, which every
    # process this one starts inherits (a sandbox's, a CLI's), are /dev/null and the logs.
    source = os.fdopen(os.dup(0), "rb", buffering=0)
    out = FrameWriter(os.dup(1))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    kind, body = _read_frame(source)
    if kind != ASSIGNMENT:
        print("orchard_async.engine.processes: a worker of ProcessRollout, not a command", file=sys.stderr)
        return 2
    assignment = msgspec.msgpack.decode(body, type=Assignment)
    tune_for_rollouts()
    try:
        run(work, assignment, source, out)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the caller raises it, naming this worker
        out.send_now(FAILED, msgspec.msgpack.encode(f"{type(exc).__name__}: {exc}"))
        return 1
    return 0

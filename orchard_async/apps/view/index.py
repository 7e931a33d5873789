"""A trajectory file, indexed by one scan: where each record is, and the few numbers per
episode the summary, the filters and the histograms need.

The scan decodes every record once (with the same decoder and the same skipping rules as
``read_trajectories``, so the numbers are ``inspect``'s) and keeps only compact columns:
offsets and lengths, reward, duration, steps, retries and small integers that point into
tables of the distinct task ids, groups, policies and end reasons. A page then decodes only
the records it shows. Memory grows by a few dozen bytes per episode, not with the file.
"""

from __future__ import annotations

import math
import multiprocessing
import struct
import threading
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import msgspec

from orchard_async.errors import ConfigError
from orchard_async.records.passk import summarize_groups
from orchard_async.records.summary import SCORED_END_REASONS, Summary, percentile_ms, share
from orchard_async.records.trajectory import EndReason, Trajectory, check_trajectory_file, read_run_header

_LENGTH = struct.Struct(">I")
_json_decoder = msgspec.json.Decoder(Trajectory)
_mp_decoder = msgspec.msgpack.Decoder(Trajectory)
_JSON_HEADER_PREFIX = b'{"orchard_run":'
_MP_HEADER_PREFIX = b"\x81\xab" + b"orchard_run"

CHILD_FROM = 5000  # episodes from which pass@k is computed in a child process

# Flag bits of one episode (the ``flags`` column).
FINISHED = 1
SUCCESS = 2
VERIFIER_ERROR = 4  # ended in a verifier error, or an attempt of it did (a retry)


class Interned:
    """Distinct strings of one column, numbered in order of first sight."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._numbers: dict[str, int] = {}

    def number(self, value: str) -> int:
        found = self._numbers.get(value)
        if found is None:
            found = self._numbers[value] = len(self.values)
            self.values.append(value)
        return found

    def find(self, value: str) -> int | None:
        return self._numbers.get(value)


class _Outcome(NamedTuple):
    """What ``passk.summarize_groups`` reads of a trajectory."""

    task_id: str
    status: str
    success: bool


class SummaryAccumulator:
    """``summary.summarize`` fed one trajectory at a time, keeping only what it sums.

    Same order of additions as ``summarize`` (and ``sum`` over the same sequence where it
    sums floats), so the result is bit-for-bit ``inspect --json``'s."""

    def __init__(self) -> None:
        self.episodes = 0
        self.finished = 0
        self.judged = 0  # what the success rate and the mean reward are over, as in records.summary
        self.successes = 0
        self.rewards = array("d")
        self.steps = 0
        self.exec_times = array("d")
        self.phase_totals: Counter[str] = Counter()
        self.end_reasons: Counter[str] = Counter()
        self.command_reasons: Counter[str] = Counter()
        self.retries = 0
        self.verifier_errors = 0
        self.model_unavailable = 0
        self.tasks = Interned()
        self.task_of = array("l")
        self.outcomes = array("b")  # 0 failed, 1 finished, 2 finished and passed

    def add(self, trajectory: Trajectory) -> None:
        self.episodes += 1
        self.finished += trajectory.status == "finished"
        if trajectory.status == "finished" and trajectory.end_reason in SCORED_END_REASONS:
            self.judged += 1
            self.successes += trajectory.success
            self.rewards.append(trajectory.reward)
        self.steps += len(trajectory.steps)
        for step in trajectory.steps:
            if step.reason is not None:
                self.exec_times.append(step.exec_s)
            if step.reason:
                self.command_reasons[step.reason] += 1
        for phase, seconds in trajectory.timings.items():
            if phase != "total":
                self.phase_totals[phase] += seconds
        self.end_reasons[str(trajectory.end_reason)] += 1
        self.retries += len(trajectory.retries)
        self.verifier_errors += trajectory.end_reason == EndReason.VERIFIER_ERROR
        self.model_unavailable += trajectory.end_reason == EndReason.MODEL_UNAVAILABLE
        self.task_of.append(self.tasks.number(trajectory.task_id))
        self.outcomes.append(0 if trajectory.status != "finished" else 2 if trajectory.success else 1)

    def groups(self, *, in_child: bool | None = None) -> dict[str, Any]:
        """``passk.summarize_groups`` of these trajectories; for a large run (or ``in_child``)
        in a child process: with exact binomials up to the smallest number of samples of a
        task it can take minutes, and in this process it would hold the GIL the server needs."""
        if not (len(self.outcomes) > CHILD_FROM if in_child is None else in_child):
            return summarize_groups(_outcomes(self.tasks.values, self.task_of, self.outcomes))
        context = multiprocessing.get_context("spawn")
        receive, send = context.Pipe(duplex=False)
        child = context.Process(
            target=_groups_in_child,
            args=(self.tasks.values, self.task_of.tobytes(), self.outcomes.tobytes(), send),
            name="orchard-view-pass-at-k",
            daemon=True,  # ends with the server
        )
        child.start()
        send.close()
        try:
            return receive.recv()
        except EOFError:  # the child died (killed, out of memory): do it here after all
            return summarize_groups(_outcomes(self.tasks.values, self.task_of, self.outcomes))
        finally:
            receive.close()
            child.join()

    def result(self, groups: dict[str, Any] | None = None) -> Summary:
        """The summary; pass@k and pass^k from ``groups`` (``passk.summarize_groups`` of these
        trajectories: ``groups()``), left empty without it."""
        count = self.episodes
        spent = sum(self.phase_totals.values()) or 1.0
        groups = groups or {"group_size": 0}
        repeated = groups["group_size"] > 1
        return Summary(
            episodes=count,
            finished=self.finished,
            failed=count - self.finished,
            success_rate=share(self.successes, self.judged),
            mean_reward=share(sum(self.rewards), self.judged),
            steps=self.steps,
            exit_reasons=dict(self.end_reasons.most_common()),
            command_reasons=dict(self.command_reasons.most_common()),
            retries=self.retries,
            exec_p50_ms=percentile_ms(self.exec_times, 50),
            exec_p99_ms=percentile_ms(self.exec_times, 99),
            time_share={phase: round(total / spent, 4) for phase, total in self.phase_totals.items()},
            verifier_errors=self.verifier_errors,
            model_unavailable=self.model_unavailable,
            pass_at_k={str(k): round(v, 4) for k, v in groups["pass_at_k"].items()} if repeated else {},
            pass_hat_k={str(k): round(v, 4) for k, v in groups["pass_hat_k"].items()} if repeated else {},
            judged=self.judged,
        )


def _outcomes(tasks: list[str], task_of: Iterable[int], outcomes: Iterable[int]) -> Iterator[_Outcome]:
    for task, outcome in zip(task_of, outcomes, strict=True):
        yield _Outcome(tasks[task], "finished" if outcome else "failed", outcome == 2)


def _groups_in_child(tasks: list[str], task_of: bytes, outcomes: bytes, send: Any) -> None:
    columns = array("l"), array("b")
    columns[0].frombytes(task_of)
    columns[1].frombytes(outcomes)
    send.send(summarize_groups(_outcomes(tasks, *columns)))
    send.close()


class RunIndex:
    """One trajectory file: its records' places and per-episode columns (row i = the i-th
    trajectory in the file). ``open`` scans it; ``trajectory(i)`` decodes one record."""

    def __init__(self, path: Path, msgpack: bool) -> None:
        self.path = path
        self.folder = path.resolve().parent
        self.msgpack = msgpack
        self.header: dict[str, Any] | None = None
        self.offsets = array("q")
        self.lengths = array("l")
        self.rewards = array("d")
        self.durations = array("d")  # timings["total"], 0 when absent
        self.step_counts = array("l")
        self.retry_counts = array("l")
        self.flags = array("b")
        self.task_of = array("l")
        self.group_of = array("l")
        self.policy_of = array("l")
        self.end_of = array("l")
        self.tasks = Interned()
        self.groups = Interned()
        self.policies = Interned()
        self.end_reasons = Interned()
        self.warnings: list[str] = []
        self.summary: Summary | None = None  # inspect's numbers; pass@k only once complete
        self.summary_complete = False
        self._accumulator = SummaryAccumulator()
        self._completing = threading.Lock()

    # -- building ------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path) -> RunIndex:
        """Scan ``path`` (a trajectory file: ConfigError otherwise) and index it."""
        path = check_trajectory_file(path)
        suffix = path.suffix.lower()
        index = cls(path, msgpack=suffix in (".msgpack", ".mpk"))
        index.header = read_run_header(path)
        index._scan()
        return index

    def _scan(self) -> None:
        accumulator = self._accumulator
        # Buffered reads, not a memory map: the file's pages never count as the server's memory.
        with open(self.path, "rb", buffering=1 << 20) as fh:
            records = self._msgpack_records(fh) if self.msgpack else self._json_records(fh)
            for offset, record in records:
                trajectory = self._decode_at_scan(offset, record)
                if trajectory is not None:
                    self._add(offset, len(record), trajectory)
                    accumulator.add(trajectory)
        self.summary = accumulator.result()

    def complete_summary(self) -> Summary:
        """The summary with pass@k and pass^k: equal to ``inspect --json``'s. Computed once
        (blocking: call it from a thread)."""
        with self._completing:
            if not self.summary_complete:
                self.summary = self._accumulator.result(self._accumulator.groups())
                self.summary_complete = True
        assert self.summary is not None
        return self.summary

    def _json_records(self, fh: BinaryIO) -> Iterator[tuple[int, bytes]]:
        offset = 0
        for line in fh:
            if not line.endswith(b"\n"):
                if line.strip():
                    self._warn(f"ignoring a torn last record ({len(line)} bytes)")
                return
            yield offset, line
            offset += len(line)

    def _msgpack_records(self, fh: BinaryIO) -> Iterator[tuple[int, bytes]]:
        offset = 0
        while len(prefix := fh.read(4)) == 4:
            (length,) = _LENGTH.unpack(prefix)
            body = fh.read(length)
            if len(body) < length:
                self._warn(f"ignoring a torn last record ({4 + len(body)} bytes)")
                return
            yield offset + 4, body
            offset += 4 + length
        if prefix:
            self._warn(f"ignoring a torn last record ({len(prefix)} bytes)")

    def _decode_at_scan(self, offset: int, record: bytes) -> Trajectory | None:
        """The record's trajectory, or None (a header, a blank line, a torn or corrupt record:
        skipped as ``read_trajectories`` skips them, with a warning)."""
        if not self.msgpack and not record.strip():
            return None
        if record.startswith(_MP_HEADER_PREFIX if self.msgpack else _JSON_HEADER_PREFIX):
            return None
        try:
            return (_mp_decoder if self.msgpack else _json_decoder).decode(record)
        except msgspec.DecodeError as exc:
            self._warn(f"skipping a corrupt record ending at byte {offset + len(record)}: {exc}")
            return None

    def _warn(self, message: str) -> None:
        if len(self.warnings) < 100:  # a file of garbage must not fill memory with warnings
            self.warnings.append(message)

    def _add(self, offset: int, length: int, trajectory: Trajectory) -> None:
        self.offsets.append(offset)
        self.lengths.append(length)
        self.rewards.append(trajectory.reward)
        self.durations.append(trajectory.timings.get("total", 0.0))
        self.step_counts.append(len(trajectory.steps))
        self.retry_counts.append(len(trajectory.retries))
        verifier = trajectory.end_reason == EndReason.VERIFIER_ERROR or any(
            retry.reason == EndReason.VERIFIER_ERROR for retry in trajectory.retries
        )
        self.flags.append(
            (FINISHED if trajectory.status == "finished" else 0)
            | (SUCCESS if trajectory.success else 0)
            | (VERIFIER_ERROR if verifier else 0)
        )
        self.task_of.append(self.tasks.number(trajectory.task_id))
        self.group_of.append(self.groups.number(trajectory.group_id))
        self.policy_of.append(self.policies.number(trajectory.policy))
        self.end_of.append(self.end_reasons.number(str(trajectory.end_reason)))

    # -- reading -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.offsets)

    def raw(self, row: int) -> bytes:
        with open(self.path, "rb") as fh:
            fh.seek(self.offsets[row])
            return fh.read(self.lengths[row])

    def trajectory(self, row: int) -> Trajectory:
        """The row's full trajectory, decoded from the file now."""
        record = self.raw(row)
        try:
            return (_mp_decoder if self.msgpack else _json_decoder).decode(record)
        except msgspec.DecodeError as exc:  # the file changed under us
            raise ConfigError(
                f"{self.path}: the record of episode {row} changed since it was indexed ({exc})"
            ) from None

    def trajectories(self, rows: Iterable[int]) -> list[Trajectory]:
        with open(self.path, "rb") as fh:
            decoded = []
            for row in rows:
                fh.seek(self.offsets[row])
                decoded.append((_mp_decoder if self.msgpack else _json_decoder).decode(fh.read(self.lengths[row])))
            return decoded


def histogram(values: Iterable[float], bins: int = 20, *, discrete: bool = True) -> dict[str, Any]:
    """Counts of ``values``: per distinct value when there are few and ``discrete`` (rewards
    are often 0/1), else ``bins`` equal-width bins between the smallest and the largest."""
    finite = [value for value in values if math.isfinite(value)]
    if not finite:
        return {"edges": [], "counts": [], "discrete": True}
    distinct = Counter(finite)
    if len(distinct) == 1 or (discrete and len(distinct) <= bins):
        keys = sorted(distinct)
        return {"edges": keys, "counts": [distinct[key] for key in keys], "discrete": True}
    low, high = min(finite), max(finite)
    width = (high - low) / bins
    counts = [0] * bins
    for value in finite:
        counts[min(bins - 1, int((value - low) / width))] += 1
    return {"edges": [low + width * i for i in range(bins + 1)], "counts": counts, "discrete": False}

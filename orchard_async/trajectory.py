"""Trajectories: the record of one episode, and append-only files of them.

Files are written one whole record per ``write`` call and flushed at once, so a killed
run loses at most the episode in flight; readers skip a torn last record. Two formats,
picked by extension: JSON Lines (``.jsonl``; pandas and Hugging Face datasets read it)
and length-prefixed MessagePack (``.msgpack``; smaller and faster).
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec

from .errors import ConfigError

FORMAT_VERSION = 1


class Action(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a policy wants done next."""

    kind: Literal["exec", "submit", "invalid"] = "exec"
    command: str = ""
    raw: str = ""  # the policy's own output (e.g. the model's reply), when it has one
    error: str = ""  # why the reply could not be turned into an action (kind="invalid")
    usage: dict[str, int] = {}  # tokens, for model policies


class Step(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    action: Action
    observation: str = ""
    exit_code: int | None = None
    reason: str | None = None  # ExitReason value of the command, if one ran
    agent_s: float = 0.0  # time the policy took to act
    exec_s: float = 0.0
    stdout_cut: int = 0
    stderr_cut: int = 0


class Op(msgspec.Struct, array_like=True):
    """One sandbox operation: name, start (seconds since the episode began), duration, outcome."""

    name: str
    start: float
    duration: float
    outcome: str = "ok"


class Retry(msgspec.Struct, kw_only=True):
    """An attempt that failed for infrastructure reasons and was retried in a fresh sandbox."""

    attempt: int
    reason: str  # ExitReason value or error class
    error: str
    duration: float


class Trajectory(msgspec.Struct, kw_only=True, omit_defaults=True):
    episode_id: str
    task_id: str
    group_id: str
    sample: int
    policy: str
    adapter: str
    run_id: str
    status: Literal["finished", "failed"]
    end_reason: str  # submitted, max_steps, deadline, policy_error, task_error, infra_error, sandbox_lost, cancelled
    reward: float = 0.0
    success: bool = False
    instruction: str = ""
    steps: list[Step] = []
    ops: list[Op] = []
    retries: list[Retry] = []
    timings: dict[str, float] = {}  # create, setup, agent, exec, score, destroy, total
    info: dict[str, Any] = {}  # recipe-specific: per-test results, usage totals, ...
    error: str = ""
    started_at: float = 0.0
    version: int = FORMAT_VERSION


_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder(Trajectory)
_mp_encoder = msgspec.msgpack.Encoder()
_mp_decoder = msgspec.msgpack.Decoder(Trajectory)
_LENGTH = struct.Struct(">I")


def _is_msgpack(path: Path) -> bool:
    suffix = path.suffix.lower()
    if suffix in (".msgpack", ".mpk"):
        return True
    if suffix in (".jsonl", ".json", ".ndjson"):
        return False
    raise ConfigError(f"{path}: unknown trajectory format; use a .jsonl or .msgpack file name")


class TrajectoryWriter:
    """Append-only writer. Each record goes out in one write and is flushed immediately."""

    def __init__(self, path: str | Path, *, fsync: bool = False):
        self.path = Path(path)
        self._msgpack = _is_msgpack(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_tail()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._fsync = fsync
        self.written = 0

    def _repair_tail(self) -> None:
        """Cut a torn record left by a killed writer, so appends start on a boundary."""
        if not self.path.exists():
            return
        ends = list(_record_ends(self.path.read_bytes(), self._msgpack))
        good = ends[-1] if ends else 0
        if good != self.path.stat().st_size:
            os.truncate(self.path, good)

    def write(self, trajectory: Trajectory) -> None:
        if self._msgpack:
            body = _mp_encoder.encode(trajectory)
            data = _LENGTH.pack(len(body)) + body
        else:
            data = _json_encoder.encode(trajectory) + b"\n"
        os.write(self._fd, data)
        if self._fsync:
            os.fsync(self._fd)
        self.written += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _record_ends(data: bytes, msgpack: bool) -> Iterator[int]:
    """Offsets just past each complete record."""
    pos = 0
    if msgpack:
        while pos + 4 <= len(data):
            (size,) = _LENGTH.unpack_from(data, pos)
            if pos + 4 + size > len(data):
                return
            pos += 4 + size
            yield pos
    else:
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                return
            pos = nl + 1
            yield pos


def read_trajectories(path: str | Path, *, strict: bool = False) -> Iterator[Trajectory]:
    """Every complete record in the file. A torn last record (a killed writer) is skipped
    with a warning; a corrupt record in the middle is an error when ``strict``."""
    path = Path(path)
    msgpack = _is_msgpack(path)
    data = path.read_bytes()
    start = 0
    for end in _record_ends(data, msgpack):
        record = data[start + 4 : end] if msgpack else data[start:end]
        start = end
        if not msgpack and not record.strip():
            continue
        try:
            yield (_mp_decoder if msgpack else _json_decoder).decode(record)
        except msgspec.DecodeError as exc:
            if strict:
                raise ConfigError(f"{path}: corrupt record at byte {start}: {exc}") from None
            print(f"warning: {path}: skipping a corrupt record ending at byte {end}: {exc}", file=sys.stderr)
    if start < len(data) and data[start:].strip():
        print(f"warning: {path}: ignoring a torn last record ({len(data) - start} bytes)", file=sys.stderr)


def finished_ids(path: str | Path) -> set[str]:
    """Episode ids already recorded in a file (for --resume)."""
    path = Path(path)
    if not path.exists():
        return set()
    return {trajectory.episode_id for trajectory in read_trajectories(path)}

"""Trajectories: the record of one episode, and append-only files of them.

Files are written one whole record per ``write`` call and flushed at once, so a killed
run loses at most the episode in flight; readers skip a torn record. Two formats, picked
by extension: JSON Lines (``.jsonl``; pandas and Hugging Face datasets read it) and
length-prefixed MessagePack (``.msgpack``; smaller and faster).

A file written by ``collect`` starts with a run header, ``{"orchard_run": {...}}`` (in
JSON Lines its first line; in MessagePack its first framed record): what the run was
(recipe, task ids, policy, episodes, group size, adapter, ...), so that ``--resume`` can
refuse to mix two different runs in one file. ``read_trajectories`` skips it;
``read_run_header`` returns it.
"""

from __future__ import annotations

import enum
import os
import struct
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from orchard_async.errors import (
    ConfigError,
    CreateFailed,
    InfraError,
    ModelUnavailable,
    SandboxLost,
    VerifierError,
)

FORMAT_VERSION = 1


class EndReason(enum.StrEnum):
    """Why an episode ended: ``Trajectory.end_reason`` (and ``Retry.reason``). The one list.

    A StrEnum, so files hold plain strings, and the fields read back as members. A value no
    member names (a file from another version or another tool) still reads: as an
    ``EndReason`` of that value that is neither scored nor the infrastructure's (``_missing_``).
    Code compares members (``is``/``==``/``in``), never strings.

    Scored ends (``status == "finished"``; the scorer judged what the agent left, so the
    reward means something):

    * ``submitted``: the policy said it was done.
    * ``max_steps``: the task's step budget ran out.
    * ``deadline``: the agent's share of the task's deadline ran out.
    * ``context_exhausted``: the policy could not go on (``ContextExhausted``, e.g. its
      model's context is full).
    * ``parse_failures``: the policy's replies could not be turned into actions
      (``Action(kind="invalid")``) the task's ``parse_failure_limit`` times in a row. The
      policy's failure, not the infrastructure's: never retried, and scored like
      ``max_steps`` on what the agent left (so RL sees the cost of unparseable output;
      the SFT export leaves it out).

    The episode's own failures (``status == "failed"``, never retried, reward 0 and not
    judged):

    * ``policy_error``: the policy raised (a bug, or a request the model server rejected).
    * ``task_error``: the task's ``setup`` (or its scoring code, outside the verifier) raised.

    The infrastructure's failures (``status == "failed"`` once retries are spent; each
    retried attempt is a ``Retry`` with one of these reasons). Never a reward:

    * ``create_failed``: no sandbox could be made (``CreateFailed``).
    * ``sandbox_lost``: the sandbox died or stopped answering (``SandboxLost``).
    * ``verifier_error``: nobody could judge the episode (``VerifierError``).
    * ``model_unavailable``: the model server could not answer (``ModelUnavailable``).
    * ``infra_error``: any other ``InfraError`` (e.g. ``BackendUnavailable``).
    * ``aborted``: a trainer aborted the episode (``engine.control.RolloutControl.abort``):
      never retried, never data.
    """

    SUBMITTED = "submitted"
    MAX_STEPS = "max_steps"
    DEADLINE = "deadline"
    CONTEXT_EXHAUSTED = "context_exhausted"
    PARSE_FAILURES = "parse_failures"
    POLICY_ERROR = "policy_error"
    TASK_ERROR = "task_error"
    CREATE_FAILED = "create_failed"
    SANDBOX_LOST = "sandbox_lost"
    VERIFIER_ERROR = "verifier_error"
    MODEL_UNAVAILABLE = "model_unavailable"
    INFRA_ERROR = "infra_error"
    ABORTED = "aborted"

    @classmethod
    def _missing_(cls, value: object) -> EndReason | None:
        if not isinstance(value, str):
            return None
        # Not cached in the members: a foreign file's values do not become part of the list.
        unknown = str.__new__(cls, value)
        unknown._name_ = value
        unknown._value_ = value
        return unknown

    @property
    def scored(self) -> bool:
        """The scorer judged the episode: its reward is data."""
        return self in _SCORED

    @property
    def is_infra(self) -> bool:
        """The backend's fault (retried by the engine) or a trainer's abort: never a reward,
        and not the policy's or the task's."""
        return self in _INFRA_ENDS

    @classmethod
    def of_infra_error(cls, error: InfraError) -> EndReason:
        """The end reason an infrastructure error gives an attempt (most specific class first)."""
        for error_class, reason in _INFRA_ERROR_ENDS:
            if isinstance(error, error_class):
                return reason
        return cls.INFRA_ERROR


_SCORED = frozenset(
    {
        EndReason.SUBMITTED,
        EndReason.MAX_STEPS,
        EndReason.DEADLINE,
        EndReason.CONTEXT_EXHAUSTED,
        EndReason.PARSE_FAILURES,
    }
)
_INFRA_ERROR_ENDS: tuple[tuple[type[InfraError], EndReason], ...] = (
    (VerifierError, EndReason.VERIFIER_ERROR),
    (ModelUnavailable, EndReason.MODEL_UNAVAILABLE),
    (SandboxLost, EndReason.SANDBOX_LOST),
    (CreateFailed, EndReason.CREATE_FAILED),
)
_INFRA_ENDS = frozenset({reason for _, reason in _INFRA_ERROR_ENDS} | {EndReason.INFRA_ERROR, EndReason.ABORTED})


# The per-step records (TurnTokens, Action, Step, Op) are gc=False: plain data that never
# refers back to itself, so the cycle collector need not track them. A rollout holds
# thousands at once and the collector's full passes walked every one of them.
class TurnTokens(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """The tokens of one model turn of a token-in/token-out policy (``--policy tokens``), as
    plain arrays (no object per token).

    Turns of one ``segment`` form one trainable sequence: the prompt the sampler saw at a
    turn is the concatenation of ``prompt_ids + token_ids`` of every earlier turn of its
    segment, then its own ``prompt_ids``. The first turn of a segment holds its whole prompt
    in ``prompt_ids``; a later one only the tokens the environment added since (the
    observation's, from the chat template's delta). A turn whose conversation is not an
    extension of the previous turn's starts a new segment."""

    segment: int = 0
    prompt_ids: list[int] = []
    token_ids: list[int] = []  # what the sampler produced, as it produced it
    logprobs: list[float] = []  # the sampler's logprob of each of token_ids
    finish_reason: str = ""  # stop, length (abort never reaches a trajectory)
    weight_version: str = ""  # the policy weights that sampled this turn, as the engine names them


class Action(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """What a policy wants done next."""

    kind: Literal["exec", "submit", "invalid"] = "exec"
    command: str = ""
    raw: str = ""  # the policy's own output (e.g. the model's reply), when it has one
    error: str = ""  # why the reply could not be turned into an action (kind="invalid")
    usage: dict[str, int] = {}  # tokens, for model policies
    tokens: TurnTokens | None = None  # token-in/token-out policies: the turn's ids and logprobs


class Step(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    index: int
    action: Action
    observation: str = ""
    exit_code: int | None = None
    reason: str | None = None  # ExitReason value of the command, if one ran
    agent_s: float = 0.0  # time the policy took to act
    exec_s: float = 0.0
    stdout_cut: int = 0
    stderr_cut: int = 0
    weight_version: str = ""  # the policy weights in force when this turn began (engine.control)


class Op(msgspec.Struct, array_like=True, gc=False):
    """One sandbox operation: name, start (seconds since the episode began), duration, outcome."""

    name: str
    start: float
    duration: float
    outcome: str = "ok"


class Retry(msgspec.Struct, kw_only=True):
    """An attempt that failed for infrastructure reasons and was retried in a fresh sandbox."""

    attempt: int
    reason: EndReason  # one of its infrastructure reasons
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
    end_reason: EndReason  # see EndReason for the list and what each means
    reward: float = 0.0
    success: bool = False
    instruction: str = ""
    steps: list[Step] = []
    ops: list[Op] = []
    retries: list[Retry] = []
    timings: dict[str, float] = {}  # create, setup, agent, exec, score, destroy, total (group_wait: groups.py)
    info: dict[str, Any] = {}  # recipe-specific: per-test results, usage totals, ...
    error: str = ""
    started_at: float = 0.0
    # The group snapshot this sample's sandbox started from (its setup ran once, in the
    # group's base; see orchard_async.engine.groups); "" when it set up its own sandbox.
    forked_from: str = ""
    version: int = FORMAT_VERSION


def episode_so_far(
    episode_id: str, instruction: str, steps: Sequence[Step] = (), *, task_id: str = "", policy: str = ""
) -> Trajectory:
    """An episode still running, as a recipe's chat builder reads a trajectory (its
    ``messages_of``): what a policy that rebuilds the chat each turn hands it."""
    return Trajectory(
        episode_id=episode_id,
        task_id=task_id,
        group_id="",
        sample=0,
        policy=policy,
        adapter="",
        run_id="",
        status="finished",
        end_reason=EndReason.MAX_STEPS,
        instruction=instruction,
        steps=list(steps),
    )


_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder(Trajectory)
_mp_encoder = msgspec.msgpack.Encoder()
_mp_decoder = msgspec.msgpack.Decoder(Trajectory)
_LENGTH = struct.Struct(">I")

# The run header: the first record of a file, ``{"orchard_run": {...}}``. Our encoders write
# a header and a trajectory with these first bytes (a Trajectory's first field is its
# episode_id), which is how a reader tells a header, and a torn record of ours, at a glance.
HEADER_KEY = "orchard_run"
_JSON_HEADER_PREFIX = b'{"orchard_run":'
_JSON_RECORD_PREFIXES = (_JSON_HEADER_PREFIX, b'{"episode_id":')
_MP_HEADER_PREFIX = b"\x81\xab" + b"orchard_run"  # a map of one entry whose key is an 11-byte string
_MP_FIRST_KEYS = (b"episode_id", b"orchard_run")

# Header keys that describe the file, not the run: never a reason to refuse a resume.
INFORMATIONAL_HEADER_KEYS = frozenset({"format", "created_at", "orchard_version", "run_id"})


def _is_msgpack(path: Path) -> bool:
    suffix = path.suffix.lower()
    if suffix in (".msgpack", ".mpk"):
        return True
    if suffix in (".jsonl", ".json", ".ndjson"):
        return False
    raise ConfigError(f"{path}: unknown trajectory format; use a .jsonl or .msgpack file name")


def check_trajectory_path(path: str | Path) -> Path:
    """A trajectory file name this module can write: a known extension. Touches nothing."""
    path = Path(path)
    _is_msgpack(path)
    return path


def _is_header(record: bytes, msgpack: bool) -> bool:
    return record.startswith(_MP_HEADER_PREFIX if msgpack else _JSON_HEADER_PREFIX)


def _decode_header(record: bytes, msgpack: bool) -> dict[str, Any]:
    data = msgspec.msgpack.decode(record) if msgpack else msgspec.json.decode(record)
    header = data.get(HEADER_KEY) if isinstance(data, dict) else None
    if not isinstance(header, dict):
        raise msgspec.DecodeError(f"a run header must be an object under {HEADER_KEY!r}")
    return header


def _encode(obj: object, msgpack: bool) -> bytes:
    if msgpack:
        body = _mp_encoder.encode(obj)
        return _LENGTH.pack(len(body)) + body
    return _json_encoder.encode(obj) + b"\n"


def _starts_like_our_msgpack(body: bytes) -> bool:
    """``body`` (possibly cut short) begins as a record this module writes: a map whose
    first key is ``episode_id`` or ``orchard_run``, that key complete."""
    if not body:
        return False
    marker = body[0]
    pos = 1 if 0x80 <= marker <= 0x8F else 3 if marker == 0xDE else 5 if marker == 0xDF else -1
    if pos < 0 or len(body) <= pos:
        return False
    key_marker = body[pos]
    if 0xA0 <= key_marker <= 0xBF:
        size, pos = key_marker & 0x1F, pos + 1
    elif key_marker == 0xD9 and len(body) > pos + 1:
        size, pos = body[pos + 1], pos + 2
    else:
        return False
    return body[pos : pos + size] in _MP_FIRST_KEYS


def _msgpack_boundary(path: Path) -> tuple[int, int]:
    """(offset just past the last complete record, file size), walking the length prefixes
    without reading the bodies."""
    size = path.stat().st_size
    pos = 0
    with open(path, "rb") as fh:
        while pos + 4 <= size:
            fh.seek(pos)
            (length,) = _LENGTH.unpack(fh.read(4))
            if pos + 4 + length > size:
                break
            pos += 4 + length
    return pos, size


class TrajectoryWriter:
    """Append-only writer. Each record goes out in one write and is flushed immediately.

    Nothing on disk changes until the first ``write``: the constructor only checks that the
    file can be appended to (so a caller can check before it starts work), and a file that
    is never written to is never created. A new (or ``replace``d) file starts with the run
    header, when one is given.

    A killed writer can leave a torn last record. This writer never cuts bytes it cannot
    prove it wrote: in JSON Lines it ends the torn line with a newline and appends after
    it (readers skip a torn line); in MessagePack, where the length prefixes leave no such
    choice, it drops the tail only when it is the start of a record of ours, and otherwise
    refuses to append.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        fsync: bool = False,
        run_header: dict[str, Any] | None = None,
        replace: bool = False,
    ):
        self.path = Path(path)
        self._msgpack = _is_msgpack(self.path)
        self._fsync = fsync
        self._run_header = run_header
        self._replace = replace
        self._fd = -1
        self.written = 0
        if self.path.is_dir():
            raise ConfigError(f"{self.path} is a directory, not a trajectory file")
        if not replace:
            self._append_plan()  # raises now, before the caller starts any work

    def _append_plan(self) -> tuple[int | None, bool]:
        """How to append: (offset to cut a torn record of ours back to, or None; whether a
        newline must end a torn JSON line first)."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return None, False
        if not self._msgpack:
            with open(self.path, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                return None, fh.read(1) != b"\n"
        good, size = _msgpack_boundary(self.path)
        if good == size:
            return None, False
        with open(self.path, "rb") as fh:
            fh.seek(good)
            tail = fh.read(4 + 32)  # the length, then the map and its first key
        if len(tail) >= 4 and _starts_like_our_msgpack(tail[4:]):
            return good, False
        raise ConfigError(
            f"{self.path} ends with {size - good} bytes that are not a record this program wrote; "
            "refusing to append after them (move the file, or cut them off yourself)"
        )

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self._replace:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
            fresh = True
        else:
            cut_to, end_line = self._append_plan()
            if cut_to is not None:
                os.truncate(self.path, cut_to)  # a torn record of ours: see the class docstring
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if end_line:
                os.write(self._fd, b"\n")
            fresh = os.fstat(self._fd).st_size == 0
        if fresh and self._run_header is not None:
            os.write(self._fd, _encode({HEADER_KEY: self._run_header}, self._msgpack))

    def write(self, trajectory: Trajectory) -> None:
        if self._fd < 0:
            self._open()
        os.write(self._fd, _encode(trajectory, self._msgpack))
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


def _is_torn_line(line: bytes) -> bool:
    """The line is the start of a valid JSON record, cut short: a killed writer's last
    record (later ended with a newline by the next writer)."""
    try:
        msgspec.json.decode(line.rstrip(b"\r\n"))
    except msgspec.DecodeError as exc:
        return "truncated" in str(exc)
    return False


def read_trajectories(path: str | Path, *, strict: bool = False) -> Iterator[Trajectory]:
    """Every trajectory in the file, the run header skipped. A torn record (a killed
    writer's; later appends leave it as a line of its own in JSON Lines) is skipped with a
    warning; any other corrupt record is skipped with a warning, or an error when ``strict``."""
    path = Path(path)
    msgpack = _is_msgpack(path)
    data = path.read_bytes()
    start = 0
    for end in _record_ends(data, msgpack):
        record = data[start + 4 : end] if msgpack else data[start:end]
        start = end
        if not msgpack and not record.strip():
            continue
        if _is_header(record, msgpack):
            continue
        try:
            yield (_mp_decoder if msgpack else _json_decoder).decode(record)
        except msgspec.DecodeError as exc:
            if not msgpack and _is_torn_line(record):
                print(f"warning: {path}: skipping a torn record ending at byte {end}", file=sys.stderr)
                continue
            if strict:
                raise ConfigError(f"{path}: corrupt record ending at byte {end}: {exc}") from None
            print(f"warning: {path}: skipping a corrupt record ending at byte {end}: {exc}", file=sys.stderr)
    if start < len(data) and data[start:].strip():
        print(f"warning: {path}: ignoring a torn last record ({len(data) - start} bytes)", file=sys.stderr)


def _first_record(path: Path, msgpack: bool) -> tuple[bytes, bool]:
    """The file's first record (the body, for MessagePack) and whether it is complete.
    Blank lines before it are skipped; an empty file gives (b"", False)."""
    with open(path, "rb") as fh:
        if not msgpack:
            for line in fh:
                if line.strip():
                    return line, line.endswith(b"\n")
            return b"", False
        prefix = fh.read(4)
        if len(prefix) < 4:
            return prefix, False
        (size,) = _LENGTH.unpack(prefix)
        body = fh.read(size)
        return body, len(body) == size


def check_trajectory_file(path: str | Path) -> Path:
    """``path`` is a trajectory file to read: it exists, is a file with a known extension,
    and its first record is a run header or a trajectory (an empty file has none, and is
    fine). Raises ConfigError saying what it is instead."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file")
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not a trajectory file (.jsonl or .msgpack)")
    msgpack = _is_msgpack(path)
    try:
        record, complete = _first_record(path, msgpack)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None
    if not record:
        return path
    if not complete:
        ours = _starts_like_our_msgpack(record) if msgpack else record.startswith(_JSON_RECORD_PREFIXES)
        if ours:
            return path  # one torn record of ours: a run killed at its first write
        raise ConfigError(f"{path} is not a trajectory file (its first record is incomplete and not one of ours)")
    try:
        if _is_header(record, msgpack):
            _decode_header(record, msgpack)
        else:
            (_mp_decoder if msgpack else _json_decoder).decode(record)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path} is not a trajectory file: its first record is not a trajectory ({exc})") from None
    return path


def read_run_header(path: str | Path) -> dict[str, Any] | None:
    """The run header of a trajectory file (what ``collect`` recorded about the run: recipe,
    task ids, policy, episodes, group size, adapter, ...), or None when the file does not
    exist, is empty, or was written without one."""
    path = Path(path)
    msgpack = _is_msgpack(path)
    if not path.is_file():
        return None
    record, complete = _first_record(path, msgpack)
    if not complete or not _is_header(record, msgpack):
        return None
    try:
        return _decode_header(record, msgpack)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: the run header is corrupt: {exc}") from None


def _show(value: object) -> str:
    if isinstance(value, list) and len(value) > 4:
        return f"[{', '.join(map(str, value[:3]))}, ... {len(value)} items]"
    return "(unset)" if value is None else str(value)


def run_header_differences(
    recorded: dict[str, Any], wanted: dict[str, Any], *, allow_more_episodes: bool = False
) -> list[str]:
    """What differs between two run headers, one phrase per setting, e.g.
    ``"policy: oracle in the file, random now"``; empty when they describe the same run.
    ``format``, ``created_at`` and ``orchard_version`` are not compared. With
    ``allow_more_episodes`` a larger ``episodes`` is no difference: the plan of N episodes
    is the first N of a longer one, so a resume may extend a run."""
    differences = []
    for key in sorted((recorded.keys() | wanted.keys()) - INFORMATIONAL_HEADER_KEYS):
        old, new = recorded.get(key), wanted.get(key)
        if old == new:
            continue
        if key == "episodes" and allow_more_episodes and isinstance(old, int) and isinstance(new, int) and new > old:
            continue
        if key == "task_ids" and isinstance(old, list) and isinstance(new, list):
            added, removed = [t for t in new if t not in set(old)], [t for t in old if t not in set(new)]
            if not added and not removed:
                differences.append("task order differs")
            else:
                differences.append(
                    f"task ids: {len(added)} added, {len(removed)} removed (e.g. {(added + removed)[0]})"
                )
            continue
        differences.append(f"{key}: {_show(old)} in the file, {_show(new)} now")
    return differences


def finished_ids(path: str | Path) -> set[str]:
    """Episode ids already recorded in a file (for --resume)."""
    path = Path(path)
    if not path.exists():
        return set()
    return {trajectory.episode_id for trajectory in read_trajectories(path)}

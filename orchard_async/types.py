"""The plain data of the contract: what a sandbox is asked to be and what a command returns."""

from __future__ import annotations

import enum
import math
import posixpath
import re
from typing import Literal

import msgspec

from orchard_async.errors import ConfigError

_LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-/]{0,61}[A-Za-z0-9])?$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MEMORY = re.compile(r"^(\d+)([kmgKMG]i?)?$")
_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 1024, "mi": 1024**2, "gi": 1024**3}

DEFAULT_OUTPUT_CAP = 1 << 20  # bytes kept per stream: half from the head, half from the tail


def _is_number(value: object) -> bool:
    """An int or a float, not a bool (``True`` is an int to Python, never a size or a count)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_memory(value: str | int | None) -> int | None:
    """'512Mi' -> 536870912. None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"memory must be bytes (an integer) or a size like '512Mi', got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(f"memory must be positive, got {value}")
        return value
    match = _MEMORY.match(value.strip())
    if not match:
        raise ConfigError(f"memory {value!r} is not a size; use bytes or a suffix like 512Mi or 2G")
    amount, unit = int(match[1]), (match[2] or "").lower()
    if amount <= 0:
        raise ConfigError(f"memory must be positive, got {value!r}")
    return amount * _UNITS[unit]


def check_env(env: dict[str, str] | None) -> None:
    if env is not None and not isinstance(env, dict):
        raise ConfigError(f"env must be a mapping of names to strings, got {type(env).__name__}")
    for key, val in (env or {}).items():
        if not isinstance(key, str) or not _ENV_KEY.match(key):
            raise ConfigError(f"environment variable name {key!r} is not a valid shell identifier")
        if not isinstance(val, str):
            raise ConfigError(f"environment variable {key} must be a string, got {val!r}")
        if "\0" in val:
            raise ConfigError(f"environment variable {key} contains a NUL byte")


def check_timeout(timeout: float | None, what: str = "timeout") -> None:
    if timeout is not None and not (_is_number(timeout) and timeout > 0):
        raise ConfigError(f"{what} must be a positive number of seconds, got {timeout!r}")


def _check_labels(labels: object) -> None:
    if not isinstance(labels, dict):
        raise ConfigError(f"labels must be a mapping of strings to strings, got {type(labels).__name__}")
    for key, val in labels.items():
        if not isinstance(key, str) or not isinstance(val, str):
            raise ConfigError(f"label {key!r}={val!r}: keys and values must be strings")
        if not _LABEL_KEY.match(key) or len(val) > 63:
            raise ConfigError(f"label {key}={val!r} is not a valid label (key: letters, digits, -_./; value: 63 chars)")


def _check_choice(what: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices or not isinstance(value, str):
        raise ConfigError(f"{what} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


def _check_writable_dirs(dirs: object) -> None:
    if not isinstance(dirs, tuple | list):  # a str is neither: "/app" is not a list of dirs
        raise ConfigError(f"writable_dirs must be a list of absolute paths, got {dirs!r}")
    for path in dirs:
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            raise ConfigError(f"writable_dirs: {path!r} is not an absolute path")
        if posixpath.normpath(path) != path or path == "/" or "//" in path:
            raise ConfigError(f"writable_dirs: {path!r} must be a normalised path below / (no '..', '.' or trailing /)")


class SandboxSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a sandbox must be. Validated on construction: a bad spec never reaches a backend."""

    image: str | None = None  # container adapters need one; local and sim ignore it
    cpu: float | None = None  # cores
    memory: str | int | None = None  # bytes or '512Mi'
    pids: int | None = None
    network: Literal["none", "on"] = "none"
    env: dict[str, str] = {}
    workdir: str | None = None  # container path; local uses a private temp dir
    ttl: float = 3600.0  # seconds until the sandbox destroys itself
    labels: dict[str, str] = {}
    pull: Literal["missing", "never", "always"] = "missing"
    # Start from this snapshot (``adapter.snapshot(sandbox)``'s id) instead of the image's
    # file system: a fork of a sandbox that was already set up (protocols.py, "Forks").
    snapshot: str | None = None
    # Absolute dirs that must exist and be writable inside the sandbox besides its workdir
    # (Harbor's tasks write /app, /logs, /tests, /solution): created at start, keeping what
    # the image already has there.
    writable_dirs: tuple[str, ...] = ()
    # GPUs the sandbox gets (docker device requests, kubernetes nvidia.com/gpu limits); an
    # adapter that cannot give them refuses the spec at create time, never a CPU-only sandbox.
    gpus: int = 0
    # Commands may switch to another user of the image (`su`, `setpriv`), as tasks with a
    # non-root agent user do: the sandbox's root keeps CAP_SETUID and CAP_SETGID, nothing more.
    switch_users: bool = False
    # Seconds its TTL may be extended by, in all, while it runs (capabilities.ExtendableTTL);
    # 0: not at all. A hard cap: kubernetes sets activeDeadlineSeconds to ttl + this.
    max_extension: float = 0.0

    def __post_init__(self) -> None:
        # Every field is checked here, types included: msgspec validates types only when it
        # decodes, and a direct SandboxSpec(memory=True) or SandboxSpec(ttl=inf) must not
        # reach a backend (inf would never expire and leak the sandbox; True would be 1 byte).
        if self.image is not None and not (isinstance(self.image, str) and self.image.strip()):
            raise ConfigError(f"image must be a non-empty string, got {self.image!r}")
        if self.cpu is not None and not (_is_number(self.cpu) and math.isfinite(self.cpu) and self.cpu > 0):
            raise ConfigError(f"cpu must be a positive, finite number of cores, got {self.cpu!r}")
        parse_memory(self.memory)
        if self.pids is not None and not (isinstance(self.pids, int) and not isinstance(self.pids, bool)):
            raise ConfigError(f"pids must be a whole number of processes, got {self.pids!r}")
        if self.pids is not None and self.pids < 1:
            raise ConfigError(f"pids must be at least 1, got {self.pids}")
        _check_choice("network", self.network, ("none", "on"))
        check_env(self.env)
        if self.workdir is not None and not (isinstance(self.workdir, str) and self.workdir.startswith("/")):
            raise ConfigError(f"workdir must be an absolute path, got {self.workdir!r}")
        if self.workdir is not None and "\0" in self.workdir:
            raise ConfigError("workdir contains a NUL byte")
        check_timeout(self.ttl, "ttl")
        if not math.isfinite(self.ttl):
            raise ConfigError(f"ttl must be a finite number of seconds (a sandbox must expire), got {self.ttl!r}")
        _check_labels(self.labels)
        _check_choice("pull", self.pull, ("missing", "never", "always"))
        if self.snapshot is not None and not (isinstance(self.snapshot, str) and self.snapshot.strip()):
            raise ConfigError(f"snapshot must be a snapshot id from adapter.snapshot(), got {self.snapshot!r}")
        _check_writable_dirs(self.writable_dirs)
        if not isinstance(self.switch_users, bool):
            raise ConfigError(f"switch_users must be true or false, got {self.switch_users!r}")
        if not (_is_number(self.max_extension) and math.isfinite(self.max_extension) and self.max_extension >= 0):
            raise ConfigError(
                f"max_extension must be a finite number of seconds (0 or more), got {self.max_extension!r}"
            )
        if not isinstance(self.gpus, int) or isinstance(self.gpus, bool) or self.gpus < 0:
            raise ConfigError(f"gpus must be a whole number of GPUs (0 or more), got {self.gpus!r}")

    @property
    def memory_bytes(self) -> int | None:
        return parse_memory(self.memory)

    @classmethod
    def parse(cls, data: bytes | str | dict) -> SandboxSpec:
        """Build a spec from JSON or a dict, with msgspec's type errors turned into ConfigError."""
        try:
            if isinstance(data, dict):
                return msgspec.convert(data, cls)
            return msgspec.json.decode(data, type=cls)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"invalid sandbox spec: {exc}") from None


class ExitReason(enum.StrEnum):
    """Why a command ended. Everything but ok/nonzero is something the command did not choose."""

    OK = "ok"
    NONZERO = "nonzero"
    TIMEOUT = "timeout"
    KILLED = "killed"  # by a signal the command did not ask for
    OOM = "oom"
    SANDBOX_LOST = "sandbox_lost"
    INFRA_ERROR = "infra_error"

    @property
    def is_infra(self) -> bool:
        return self in (ExitReason.SANDBOX_LOST, ExitReason.INFRA_ERROR)


class ExecResult(msgspec.Struct, frozen=True, kw_only=True):
    """One command's outcome. Streams are raw bytes; ``.text``/``.error_text`` decode on demand."""

    exit_code: int
    reason: ExitReason
    stdout: bytes = b""
    stderr: bytes = b""
    duration: float = 0.0
    stdout_cut: int = 0  # bytes dropped from the middle of stdout by the output cap
    stderr_cut: int = 0

    @property
    def ok(self) -> bool:
        return self.reason is ExitReason.OK

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def error_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")


class FileInfo(msgspec.Struct, frozen=True):
    name: str
    path: str
    size: int
    is_dir: bool
    mode: int
    mtime: float

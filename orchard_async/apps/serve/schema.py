"""Request bodies, as Orchard Env's client sends them, decoded and type-checked in one step.

Fields past Orchard's are this service's extensions (the ``remote`` adapter uses them);
Orchard's client never sends them, so they never change what it sees.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Literal, TypeVar

import msgspec

T = TypeVar("T")

SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_CPU = re.compile(r"^(\d+(?:\.\d+)?)(m?)$")


class ApiError(Exception):
    """An answer other than success: status, a one-line ``detail``, and a machine ``reason``."""

    def __init__(self, status: int, detail: str, reason: str = "", headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.reason = reason or {400: "bad_request", 404: "not_found", 422: "invalid"}.get(status, f"http_{status}")
        self.headers = headers or {}


class CreateRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    image: str | None  # required; null only from the remote adapter, for adapters without images
    block_network: bool = True
    sandbox_id: str | None = None
    cpu: str | int | float | None = None  # Orchard: a string ("2", "500m")
    memory: str | int | None = None  # "512Mi"
    timeout: int | None = None  # the sandbox's lifetime in seconds
    # extensions
    env: dict[str, str] = {}
    labels: dict[str, str] = {}
    workdir: str | None = None
    pids: int | None = None
    writable_dirs: list[str] = []
    gpus: int = 0
    switch_users: bool = False


class ExecRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    command: str | list[str]
    timeout_seconds: int | float | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    login_shell: bool = False
    wait: bool | msgspec.UnsetType = msgspec.UNSET  # absent only in the client's retry (see jobs.py)
    # extensions: "native" runs the library's exec as is (sh, stdin, bytes out in base64)
    mode: Literal["orchard", "native"] = "orchard"
    stdin: str | None = None  # base64
    session: str | None = None


class PatchRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    patch: str
    timeout_seconds: int | float = 30
    cwd: str | None = None  # extension


class UploadRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: str
    content: str  # base64
    mode: int = 0o644  # extension


def decode(body: bytes, kind: type[T]) -> T:
    """The body as ``kind``: 400 when it is not JSON, 422 when a field is missing or mistyped."""
    if not body:
        raise ApiError(400, "the request needs a JSON body", "bad_json")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise ApiError(422, f"invalid request: {exc}", "invalid") from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}", "bad_json") from None


def b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(422, f"{what} must be base64", "invalid") from None


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode()


def parse_cpu(value: str | int | float | None) -> float | None:
    """Cores from Orchard's cpu string: "2" -> 2.0, "500m" -> 0.5."""
    if value is None or isinstance(value, int | float):
        return None if value is None else float(value)
    match = _CPU.match(value.strip())
    if not match:
        raise ApiError(422, f"cpu {value!r} is not a number of cores like '2' or '500m'", "invalid")
    cores = float(match[1]) / (1000 if match[2] else 1)
    return cores

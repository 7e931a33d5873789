"""API keys and their quotas: who may call the service, and how much.

The key file holds hashes only, never a key: anyone who reads the file cannot call the
service with what they read. A key is a long random token, so one SHA-256 is enough (a
slow password hash protects guessable secrets, which these are not)::

    {"keys": [{"name": "team-a", "sha256": "<64 hex>", "max_sandboxes": 100, "creates_per_minute": 600}]}

``name`` is the tenant: it labels the key's sandboxes, metrics and log lines (the key
itself never appears anywhere). ``orchard-async serve --new-key NAME`` prints a fresh key
and the line to add. A presented key is hashed and compared with every stored hash in
constant time, so the time an answer takes says nothing about how close a guess was.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import re
import secrets
import time
from pathlib import Path

import msgspec

from orchard_async.errors import ConfigError

DEFAULT_MAX_SANDBOXES = 100
DEFAULT_CREATES_PER_MINUTE = 600
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")  # usable as a label value


class Tenant(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One key's owner and quota. ``sha256`` is the key's hash (hex)."""

    name: str
    sha256: str = ""
    max_sandboxes: int = DEFAULT_MAX_SANDBOXES
    creates_per_minute: int = DEFAULT_CREATES_PER_MINUTE


class _KeyFile(msgspec.Struct, forbid_unknown_fields=True):
    keys: list[Tenant]


ANONYMOUS = Tenant(name="local", max_sandboxes=10_000, creates_per_minute=1_000_000)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(name: str) -> tuple[str, str]:
    """A fresh key and the key-file entry (JSON) that admits it."""
    if not _NAME.match(name):
        raise ConfigError(f"key name {name!r}: use letters, digits, '-', '_', '.' (at most 63)")
    key = "oa_" + secrets.token_urlsafe(32)
    entry = {
        "name": name,
        "sha256": hash_key(key),
        "max_sandboxes": DEFAULT_MAX_SANDBOXES,
        "creates_per_minute": DEFAULT_CREATES_PER_MINUTE,
    }
    return key, json.dumps(entry)


def load_keys(path: str | Path) -> list[Tenant]:
    """The tenants of a key file; anything wrong with it is a one-line ConfigError."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"--keys {path}: cannot read it ({exc.strerror})") from None
    if b'"key"' in raw:
        raise ConfigError(f"--keys {path}: store keys as sha256 hashes, never the key itself (see --new-key)")
    try:
        tenants = msgspec.json.decode(raw, type=_KeyFile).keys
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigError(f'--keys {path}: {exc} (expected {{"keys": [{{"name", "sha256", ...}}]}})') from None
    names: set[str] = set()
    for tenant in tenants:
        if not _NAME.match(tenant.name):
            raise ConfigError(f"--keys {path}: key name {tenant.name!r} must be letters, digits, '-', '_', '.'")
        if tenant.name in names:
            raise ConfigError(f"--keys {path}: the name {tenant.name!r} appears twice; names must be unique")
        if not _HEX64.match(tenant.sha256):
            raise ConfigError(f"--keys {path}: key {tenant.name!r} needs sha256 as 64 lowercase hex digits")
        if tenant.max_sandboxes < 1 or tenant.creates_per_minute < 1:
            raise ConfigError(f"--keys {path}: key {tenant.name!r}: quotas must be at least 1")
        names.add(tenant.name)
    if not tenants:
        raise ConfigError(f"--keys {path}: the file lists no key; nobody could call the service")
    return tenants


class KeyStore:
    """Finds the tenant of a presented key. Without tenants (no --keys) everyone is ANONYMOUS."""

    def __init__(self, tenants: list[Tenant] | None = None):
        self.tenants = tenants or []
        self._digests = [(bytes.fromhex(t.sha256), t) for t in self.tenants]

    @property
    def required(self) -> bool:
        return bool(self.tenants)

    def authenticate(self, key: str) -> Tenant | None:
        digest = hashlib.sha256(key.encode()).digest()
        found = None
        for stored, tenant in self._digests:  # every hash is compared: no early exit to time
            if hmac.compare_digest(digest, stored):
                found = tenant
        return found


class CreateRate:
    """Creates per minute per tenant, over a sliding window."""

    WINDOW = 60.0

    def __init__(self) -> None:
        self._times: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)

    def admit(self, tenant: Tenant) -> float:
        """0 when a create is admitted now (and counted); else seconds until one would be."""
        now = time.monotonic()
        times = self._times[tenant.name]
        while times and times[0] <= now - self.WINDOW:
            times.popleft()
        if len(times) >= tenant.creates_per_minute:
            return max(times[0] + self.WINDOW - now, 0.001)
        times.append(now)
        return 0.0

    def recent(self, tenant: Tenant, now: float) -> int:
        """The tenant's creates within the window that ends ``now``."""
        return sum(1 for at in self._times.get(tenant.name, ()) if at > now - self.WINDOW)

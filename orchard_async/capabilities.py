"""Optional capabilities: what an adapter or its sandboxes may offer beyond ``protocols.Adapter``
and ``protocols.Sandbox``, each a small protocol a caller checks with ``isinstance``::

    if isinstance(adapter, Snapshots):
        snapshot_id = await adapter.snapshot(sandbox)

A class declares the ones it offers in ``capabilities``, a frozenset of these protocols::

    class MyAdapter:
        name = "mine"
        capabilities = frozenset({Doctor, Facts})

``tests/core/test_capabilities.py`` holds every adapter of the registry (and the sandbox classes
its ``create`` is annotated to return) to that: the mandatory contract, each declared capability
with the protocol's signatures, and no member of an undeclared one (so ``isinstance`` answers
what the class declares).

Adapters: ``Snapshots`` (forks), ``Reattach`` (taking over sandboxes a gone controller made),
``Doctor`` (a one-line report), ``Facts`` (what the backend is: its default image, ...).
Sandboxes: ``Ping`` (a liveness check that runs no command), ``FileRoot`` (where its paths are
rooted), ``NetworkControl`` (its egress switched while it runs: ``set_network``, with the policy's
shapes here: ``EgressRule``, ``NetworkPolicy``, ``NetworkState``), ``Exposes`` (a port as a
loopback URL: ``sandbox.expose(port)``), ``ExtendableTTL`` (its TTL moved on while it runs:
``extend_ttl``, up to ``SandboxSpec.max_extension``). Streams (``open_stream``,
``connect``) are not optional: every sandbox has them, and one whose backend runs no processes
refuses them with ``ConfigError`` (see ``protocols.Sandbox``).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import msgspec

from orchard_async.errors import ConfigError

if TYPE_CHECKING:
    from orchard_async.protocols import Sandbox


# -- adapters -------------------------------------------------------------------------------


@runtime_checkable
class Snapshots(Protocol):
    """Forks: ``snapshot`` freezes a sandbox's file system (not its processes) and returns a
    snapshot id; a sandbox created from ``msgspec.structs.replace(spec, snapshot=id)`` starts
    with that file system, and every such fork is independent (a write in one is never seen in
    another or in the snapshot). ``drop_snapshot`` removes it (idempotent). A snapshot carries
    the run's lease labels, so ``reap`` removes it after a crash like a sandbox; an adapter that
    cannot snapshot here raises ``ConfigError`` saying why. The rollout engine uses it for groups
    of a task that opts in (``Task.fork_after_setup = True``): set up once, ``group_size``
    samples started from the snapshot."""

    async def snapshot(self, sandbox: Sandbox) -> str: ...

    async def drop_snapshot(self, snapshot_id: str) -> None: ...


@runtime_checkable
class Reattach(Protocol):
    """Taking over sandboxes another controller made (``orchard-async serve`` after a restart;
    docker and kubernetes with a ``reattach_grace``)."""

    async def find_sandboxes(self, labels: dict[str, str]) -> dict[str, dict[str, str]]:
        """Sandboxes (anyone's) carrying every one of ``labels``: id -> their labels."""
        ...

    async def attach(self, sandbox_id: str) -> Sandbox:
        """A new shell session on one whose controller is gone: ``SandboxLost`` when it cannot
        be used, ``CreateFailed`` while another controller still holds it."""
        ...


@runtime_checkable
class Doctor(Protocol):
    """``orchard-async doctor``'s line for this backend: what it is and what isolation it gives
    here. Raises ``AdapterUnavailable`` when the backend cannot be used on this machine (an
    adapter without it is reported as "ready")."""

    async def doctor(self) -> str: ...


class AdapterFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What a backend is, for the callers that describe or size a run by it."""

    image: str | None = None  # the image a spec without one runs (None: the backend has no images)
    host_dir: str | None = None  # each sandbox's own directory is under this one, on this machine
    max_creating: int | None = None  # creates it runs at once (its own gate), where it has one
    runs_commands: bool = True  # False: commands only pretend to run (sim); recipes' ADAPTER_NEEDS name it


@runtime_checkable
class Facts(Protocol):
    facts: AdapterFacts


def facts_of(adapter: object) -> AdapterFacts:
    """The adapter's facts; an adapter that states none has the defaults (nothing known)."""
    return adapter.facts if isinstance(adapter, Facts) else AdapterFacts()


# -- sandboxes ------------------------------------------------------------------------------


@runtime_checkable
class Ping(Protocol):
    """Whether the sandbox answers, without running a command (the warm pool's check before it
    hands a sandbox out): False when it is gone or did not answer within ``timeout`` seconds."""

    async def ping(self, timeout: float) -> bool: ...


@runtime_checkable
class FileRoot(Protocol):
    """``root`` bounds the paths its file operations accept: "/" wherever they run as the
    sandbox's commands do (containers, and the local adapter, under its isolation)."""

    root: str


NetworkMode = Literal["enabled", "restricted"]
NETWORK_MODES: tuple[str, ...] = ("enabled", "restricted")


class EgressRule(msgspec.Struct, frozen=True, kw_only=True):
    """One destination a restricted sandbox may open connections to: an address range (no
    DNS names: an allowlist by address works without a resolver) and a port range. Orchard
    Env's shape; ``egress_rule`` normalizes one (a bare address becomes a host prefix,
    ``port_end`` defaults to ``port_start``)."""

    cidr: str
    protocol: Literal["TCP", "UDP"] = "TCP"
    port_start: int
    port_end: int


class NetworkPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What a sandbox's egress should be: ``enabled`` (any destination) or ``restricted`` to
    ``allow`` (empty: no egress at all; loopback inside the sandbox always works)."""

    mode: NetworkMode
    allow: tuple[EgressRule, ...] = ()


OFFLINE = NetworkPolicy(mode="restricted")
ONLINE = NetworkPolicy(mode="enabled")


class NetworkState(msgspec.Struct, frozen=True, kw_only=True):
    """A sandbox's egress as its adapter last set it. ``revision`` counts the changes (0: as
    created), so a caller can make a change conditional on what it read (``set_network(...,
    revision=n)``). ``host_address``: the address of the controller's machine as the sandbox
    reaches it (a service there listening on all addresses, once allowlisted), where the
    adapter has one."""

    mode: NetworkMode
    allow: tuple[EgressRule, ...] = ()
    revision: int = 0
    host_address: str | None = None

    @property
    def policy(self) -> NetworkPolicy:
        return NetworkPolicy(mode=self.mode, allow=self.allow)


def egress_rule(rule: EgressRule | Mapping[str, Any]) -> EgressRule:
    """A checked, normalized rule; ``ConfigError`` (one line) for a bad one. A range that
    covers a whole address family (``0.0.0.0/0``, ``::/0``) is refused: that is ``enabled``."""
    fields = msgspec.to_builtins(rule) if isinstance(rule, EgressRule) else dict(rule)
    unknown = set(fields) - {"cidr", "protocol", "port_start", "port_end"}
    if unknown:
        raise ConfigError(f"egress rule {fields!r}: unknown field(s) {', '.join(sorted(unknown))}")
    try:
        network = ipaddress.ip_network(str(fields["cidr"]), strict=False)
    except KeyError:
        raise ConfigError(f"egress rule {fields!r}: cidr is required") from None
    except ValueError:
        raise ConfigError(f"egress rule {fields!r}: cidr must be an IPv4 or IPv6 address or network") from None
    if network.prefixlen == 0:
        raise ConfigError(f"egress rule {fields!r}: {network} allows every address; use mode 'enabled' instead")
    protocol = str(fields.get("protocol") or "TCP").upper()
    if protocol not in ("TCP", "UDP"):
        raise ConfigError(f"egress rule {fields!r}: protocol must be TCP or UDP")
    start, end = fields.get("port_start"), fields.get("port_end")
    end = start if end is None else end
    if not all(isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535 for port in (start, end)):
        raise ConfigError(f"egress rule {fields!r}: port_start (required) and port_end must be ports (1-65535)")
    assert isinstance(start, int) and isinstance(end, int)
    if end < start:
        raise ConfigError(f"egress rule {fields!r}: port_end is below port_start")
    return EgressRule(cidr=str(network), protocol=protocol, port_start=start, port_end=end)  # type: ignore[arg-type]


def network_policy(mode: str, allow: Sequence[EgressRule | Mapping[str, Any]] = ()) -> NetworkPolicy:
    """The checked policy for ``set_network(mode, allow)``; ``ConfigError`` for a bad one."""
    if mode not in NETWORK_MODES:
        raise ConfigError(f"network mode must be one of {', '.join(NETWORK_MODES)}, not {mode!r}")
    if isinstance(allow, str | bytes | Mapping):
        raise ConfigError("allow must be a list of egress rules")
    rules = tuple(egress_rule(rule) for rule in allow)
    if mode == "enabled" and rules:
        raise ConfigError("an allowlist only applies to mode 'restricted' (mode 'enabled' allows every destination)")
    return NetworkPolicy(mode=mode, allow=tuple(dict.fromkeys(rules)))  # type: ignore[arg-type]


def spec_network(network: str) -> NetworkPolicy:
    """The policy a sandbox is created with: ``SandboxSpec.network`` "on" is enabled, "none"
    restricted to nothing."""
    return ONLINE if network == "on" else OFFLINE


class NetworkConflict(ConfigError):
    """A conditional change (``revision=``) lost to another one, or ran while one was under
    way: read the state again and decide anew (the service answers 409)."""


@runtime_checkable
class NetworkControl(Protocol):
    """Egress switched while the sandbox runs (an environment set up online, then isolated
    before anything untrusted runs in it). ``set_network`` returns once the new policy holds
    for every new connection; a restricted sandbox's other traffic is refused (loopback inside
    it excepted), and so are packets of connections it opened before the change to a
    destination no longer allowed. ``revision``: apply only if the state is still at that
    revision, else ``NetworkConflict``. ``ConfigError`` (one line) when this sandbox's network
    cannot be switched here (the adapter says why; ``orchard-async doctor`` says what it can)."""

    async def set_network(
        self,
        mode: str,
        allow: Sequence[EgressRule | Mapping[str, Any]] = (),
        *,
        revision: int | None = None,
    ) -> NetworkState: ...

    async def get_network(self) -> NetworkState: ...


@runtime_checkable
class Exposes(Protocol):
    """A port of the sandbox as a URL on the controller's loopback (``kit.expose``: every
    connection relayed through ``connect``, so it works with the network off): ``expose``
    answers ``http://127.0.0.1:N`` (the same for the same port) until ``unexpose(port)`` or the
    sandbox's close; for HTTP and WebSocket clients in the controller's process (OpenEnv, MCP).
    ``unexpose`` is False for a port that was not exposed."""

    async def expose(self, port: int) -> str: ...

    async def unexpose(self, port: int) -> bool: ...


class TTLCapExceeded(ConfigError):
    """An extension past what the sandbox's spec allows (``SandboxSpec.max_extension``, the
    seconds its TTL may be extended by in all); the message names the cap and what is left."""


@runtime_checkable
class ExtendableTTL(Protocol):
    """The sandbox's life extended while it runs (a rollout paused across a trainer's weight
    sync: ``engine.control``). ``extend_ttl(seconds)`` moves its expiry ``seconds`` later and
    returns the new expiry as wall-clock epoch seconds (``time.time()``'s scale), once the
    backend holds it. Extensions add up to at most the spec's ``max_extension`` seconds: one
    past it raises ``TTLCapExceeded`` (a ``ConfigError`` naming the cap) and changes nothing,
    never a clamped extension. ``SandboxLost`` for a sandbox closed, lost or already past its
    expiry; ``ConfigError`` for seconds that are not a positive finite number, or where this
    sandbox's backend cannot extend it (the adapter says why). Nothing inside the sandbox can
    extend it: what its self-destruct timer re-reads is out of the agent's reach, and the
    timer never goes past the cap."""

    async def extend_ttl(self, seconds: float) -> float: ...


def check_extension(sandbox_id: str, seconds: float, extended: float, max_extension: float) -> None:
    """Refuse an extension of ``seconds`` on top of ``extended`` already granted (ExtendableTTL):
    ConfigError for a bad number, TTLCapExceeded past ``max_extension``."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not (math.isfinite(seconds) and seconds > 0)
    ):
        raise ConfigError(f"extend_ttl takes a positive, finite number of seconds, got {seconds!r}")
    if extended + seconds > max_extension + 1e-6:
        left = max(0.0, max_extension - extended)
        raise TTLCapExceeded(
            f"sandbox {sandbox_id}: extending its TTL by {seconds:g} s passes its cap, max_extension={max_extension:g} s "
            f"in all ({left:g} s left); create it with a larger SandboxSpec.max_extension"
        )


ADAPTER_CAPABILITIES: tuple[type, ...] = (Snapshots, Reattach, Doctor, Facts)
SANDBOX_CAPABILITIES: tuple[type, ...] = (Ping, FileRoot, NetworkControl, Exposes, ExtendableTTL)

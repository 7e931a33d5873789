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
rooted). Streams (``open_stream``, ``connect``) are not optional: every sandbox has them, and one
whose backend runs no processes refuses them with ``ConfigError`` (see ``protocols.Sandbox``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import msgspec

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


ADAPTER_CAPABILITIES: tuple[type, ...] = (Snapshots, Reattach, Doctor, Facts)
SANDBOX_CAPABILITIES: tuple[type, ...] = (Ping, FileRoot)

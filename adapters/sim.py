"""The sim adapter: sandboxes with no processes behind them.

For two jobs: measuring the core's own cost at 10,000+ concurrent episodes (zero
latency), and testing the engine against faults it must survive. Latencies are drawn
from configurable distributions; every random draw comes from a generator seeded by
(seed, episode label, attempt), so a run is the same whatever the scheduling order.

Commands understood: ``exit N``, ``echo TEXT``, ``sleep S`` (simulated), ``cat PATH``;
anything else succeeds with empty output. Files live in a dict per sandbox. Streams
(``open_stream``, ``connect``) are a ConfigError: there is no process to reach.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import posixpath
import random
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, NoReturn

import anyio
import msgspec

from orchard_async.capabilities import (
    AdapterFacts,
    EgressRule,
    ExtendableTTL,
    Facts,
    NetworkControl,
    NetworkPolicy,
    NetworkState,
    check_extension,
    spec_network,
)
from orchard_async.errors import (
    BackendUnavailable,
    ConfigError,
    CreateFailed,
    PathOutsideSandbox,
    SandboxLost,
)
from orchard_async.kit import labels as names
from orchard_async.kit.egress import NetworkSwitch
from orchard_async.protocols import DEFAULT_EXEC_TIMEOUT
from orchard_async.types import ExecResult, ExitReason, FileInfo, SandboxSpec, check_timeout


class Latency(msgspec.Struct, frozen=True):
    """A latency distribution in seconds: ``const:0.01``, ``uniform:0.01,0.05``,
    ``exp:0.02`` (mean), ``lognormal:MU,SIGMA`` (of the log)."""

    kind: str = "const"
    a: float = 0.0
    b: float = 0.0

    @classmethod
    def parse(cls, text: str | float) -> Latency:
        if isinstance(text, int | float):
            return cls("const", float(text))
        kind, _, args = text.partition(":")
        try:
            values = [float(v) for v in args.split(",")] if args else [0.0]
        except ValueError:
            raise ConfigError(f"latency {text!r}: parameters must be numbers") from None
        if (
            kind not in ("const", "uniform", "exp", "lognormal")
            or len(values) > 2
            or min(values) < 0
            and kind != "lognormal"
        ):
            raise ConfigError(f"latency {text!r}: use const:S, uniform:A,B, exp:MEAN or lognormal:MU,SIGMA")
        return cls(kind, values[0], values[1] if len(values) > 1 else 0.0)

    def draw(self, rng: random.Random) -> float:
        if self.kind == "const":
            return self.a
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        if self.kind == "exp":
            return rng.expovariate(1 / self.a) if self.a > 0 else 0.0
        return rng.lognormvariate(self.a, self.b)


class SimConfig(msgspec.Struct, kw_only=True, frozen=True):
    seed: int = 0
    create_latency: Latency = Latency()
    exec_latency: Latency = Latency()
    file_latency: Latency = Latency()
    destroy_latency: Latency = Latency()
    create_failure_rate: float = 0.0  # probability that a create fails
    exec_hang_rate: float = 0.0  # probability that a command never returns (until its timeout)
    death_rate: float = 0.0  # probability, per command, that the sandbox dies
    outage: tuple[int, int] | None = None  # creates number [a, b) fail: a backend down for a while


async def _no_enforcement(policy: NetworkPolicy) -> None:
    return None


class SimSandbox:
    capabilities = frozenset({NetworkControl, ExtendableTTL})
    extended = 0.0  # seconds extend_ttl has added (set on the instance by the first one)

    def __init__(self, adapter: SimAdapter, sandbox_id: str, spec: SandboxSpec, rng: random.Random):
        self.id = sandbox_id
        self.workdir = spec.workdir or "/sim"
        self.labels = dict(spec.labels)
        self._adapter = adapter
        self._config = adapter.config
        self._rng = rng
        self.files: dict[str, bytes] = {}
        self.dead = False
        self.closed = False
        self._instant_exec = adapter.config.exec_latency == Latency()
        self.expires_at = time.monotonic() + spec.ttl  # a hung command without a timeout waits for this
        self.max_extension = spec.max_extension
        self._network_mode = spec.network
        self.network_changes: list[NetworkPolicy] = []

    @functools.cached_property
    def _network(self) -> NetworkSwitch:
        # Its commands do not run, so its network is bookkeeping only: the engine's switching is
        # what it shows. Made when first asked for: most sandboxes never are.
        return NetworkSwitch(spec_network(self._network_mode), _no_enforcement)

    async def set_network(
        self, mode: str, allow: Sequence[EgressRule | Mapping[str, Any]] = (), *, revision: int | None = None
    ) -> NetworkState:
        if self.dead or self.closed:
            raise SandboxLost(f"simulated sandbox {self.id} is gone")
        state = await self._network.set(mode, allow, revision=revision)
        self.network_changes.append(state.policy)
        return state

    async def get_network(self) -> NetworkState:
        return self._network.state

    async def extend_ttl(self, seconds: float) -> float:
        """Move the expiry on (capabilities.ExtendableTTL): what a hung command waits for."""
        now = time.monotonic()
        if self.dead or self.closed or self.expires_at <= now:
            raise SandboxLost(f"simulated sandbox {self.id} is gone: its TTL cannot be extended")
        check_extension(self.id, seconds, self.extended, self.max_extension)
        self.extended += seconds
        self.expires_at += seconds
        await asyncio.sleep(0)  # a backend call, as the other adapters make
        return time.time() + self.expires_at - now

    async def _wait(self, latency: Latency) -> None:
        await _sleep(latency, self._rng)

    def _lost(self) -> ExecResult:
        return ExecResult(exit_code=-1, reason=ExitReason.SANDBOX_LOST, stderr=b"simulated sandbox died")

    async def exec(
        self,
        cmd: str,
        *,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        check_timeout(timeout)
        if self.dead or self.closed:
            return self._lost()
        config = self._config
        started = time.perf_counter()
        if config.death_rate and self._rng.random() < config.death_rate:
            self.dead = True
            return self._lost()
        if config.exec_hang_rate and self._rng.random() < config.exec_hang_rate:
            if timeout is None:  # no limit of its own (protocols.py): it hangs until the sandbox ends
                await anyio.sleep(max(0.0, self.expires_at - time.monotonic()))
                self.dead = True
                return self._lost()
            await anyio.sleep(timeout)
            return ExecResult(exit_code=137, reason=ExitReason.TIMEOUT, duration=time.perf_counter() - started)
        if self._instant_exec:
            await asyncio.sleep(0)  # the hot path of the scale benchmark: no draw, no extra frame
            code, out = self._interpret(cmd)
            return ExecResult(exit_code=code, reason=ExitReason.OK if code == 0 else ExitReason.NONZERO, stdout=out)
        await self._wait(config.exec_latency)
        code, out = self._interpret(cmd)
        reason = ExitReason.OK if code == 0 else ExitReason.NONZERO
        return ExecResult(exit_code=code, reason=reason, stdout=out, duration=time.perf_counter() - started)

    def _interpret(self, cmd: str) -> tuple[int, bytes]:
        words = cmd.split()  # deliberately not a shell: the sim's cost must stay near zero
        if not words:
            return 0, b""
        if words[0] == "exit" and len(words) == 2 and words[1].isdigit():
            return int(words[1]), b""
        if words[0] == "echo":
            return 0, (" ".join(words[1:]) + "\n").encode()
        if words[0] == "cat" and len(words) == 2:
            data = self.files.get(self._resolve(words[1]))
            return (0, data) if data is not None else (1, b"")
        return 0, b""

    def _resolve(self, path: str) -> str:
        full = posixpath.normpath(posixpath.join(self.workdir, path))
        if "\0" in path:
            raise PathOutsideSandbox(f"path {path!r} contains a NUL byte")
        return full

    async def read_file(self, path: str) -> bytes:
        await self._file_op()
        data = self.files.get(self._resolve(path))
        if data is None:
            raise FileNotFoundError(path)
        return data

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        await self._file_op()
        self.files[self._resolve(path)] = data.encode() if isinstance(data, str) else data

    async def list_dir(self, path: str = ".") -> list[FileInfo]:
        await self._file_op()
        base = self._resolve(path)
        return [
            FileInfo(posixpath.basename(p), p, len(d), False, 0o644, 0.0)
            for p, d in sorted(self.files.items())
            if posixpath.dirname(p) == base
        ]

    async def apply_patch(self, patch: str | bytes, *, cwd: str | None = None) -> ExecResult:
        return await self.exec("true")

    async def _file_op(self) -> None:
        if self.dead or self.closed:
            raise SandboxLost("simulated sandbox died")
        await self._wait(self._config.file_latency)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[SimSandbox]:
        yield self

    async def open_stream(self, argv: Sequence[str]) -> NoReturn:
        """A simulated sandbox runs no processes, so there is nothing to stream to (an echo
        would make a GUI or service episode look as if it ran)."""
        raise ConfigError(
            "the sim adapter runs no processes, so open_stream and connect have nothing to reach; "
            "use the local, docker or kubernetes adapter"
        )

    async def connect(self, port: int) -> NoReturn:
        await self.open_stream(["connect", str(port)])

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._adapter.live.pop(self.id, None)  # first: a cancelled close must not leak the record
        await self._wait(self._config.destroy_latency)
        self._adapter.destroyed += 1

    async def __aenter__(self) -> SimSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SimAdapter:
    name = "sim"
    capabilities = frozenset({Facts})
    # A fact recipes read (their ADAPTER_NEEDS): commands here only pretend to run.
    facts = AdapterFacts(runs_commands=False)

    def __init__(self, config: SimConfig | None = None, **options: object):
        self.config = config or msgspec.convert(options, SimConfig)
        self.live: dict[str, SimSandbox] = {}
        self.creates = 0  # create calls so far, the clock of the outage window
        self.created = 0
        self.destroyed = 0
        config = self.config
        latencies = (config.create_latency, config.exec_latency, config.file_latency, config.destroy_latency)
        # Without faults or random latencies no draw is ever made: skip seeding a generator
        # per sandbox (a Random is ~2.5 KB and its seeding a hash; 25 MB at 10k sandboxes).
        self._random = bool(config.create_failure_rate or config.exec_hang_rate or config.death_rate) or any(
            latency.kind != "const" for latency in latencies
        )
        self._token = uuid.uuid4().hex[:6]
        self._ids = itertools.count()

    def _rng(self, spec: SandboxSpec) -> random.Random:
        key = f"{self.config.seed}/{spec.labels.get(names.EPISODE, '')}/{spec.labels.get(names.ATTEMPT, '')}"
        if not spec.labels.get(names.EPISODE):
            key += f"/{self.creates}"
        return random.Random(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big"))

    async def create(self, spec: SandboxSpec) -> SimSandbox:
        if spec.gpus:
            raise ConfigError(f"the sim adapter has no GPU to simulate (gpus={spec.gpus})")
        number = self.creates
        self.creates += 1
        rng = self._rng(spec) if self._random else None
        await _sleep(self.config.create_latency, rng)
        outage = self.config.outage
        if outage and outage[0] <= number < outage[1]:
            raise BackendUnavailable(f"simulated backend outage (create #{number})")
        if self.config.create_failure_rate and rng.random() < self.config.create_failure_rate:
            raise CreateFailed(f"simulated create failure (create #{number})")
        sandbox = SimSandbox(self, f"sim-{self._token}{next(self._ids):06x}", spec, rng)  # type: ignore[arg-type]
        self.live[sandbox.id] = sandbox
        self.created += 1
        return sandbox

    async def list_owned(self) -> list[str]:
        return list(self.live)

    async def reap(self, older_than: float = 0.0) -> list[str]:
        ids = list(self.live)
        for sandbox in list(self.live.values()):
            await sandbox.close()
        return ids

    async def close(self) -> None:
        await self.reap()

    async def __aenter__(self) -> SimAdapter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _sleep(latency: Latency, rng: random.Random) -> None:
    """Every simulated operation yields to the loop, as real I/O would, even at zero latency."""
    delay = latency.draw(rng)
    if delay > 0:
        await anyio.sleep(delay)
    else:
        await asyncio.sleep(0)  # anyio's checkpoint costs a backend lookup per call

"""A Sandbox built on a shell-session client: every adapter with a shell reuses this.

File operations are ordinary framed commands (``cat``, ``find``/``stat``, ``git apply``),
so they work on any image with ``sh`` and behave the same on tmpfs mounts and
read-only roots, where archive-copy APIs do not.
"""

from __future__ import annotations

import posixpath
import stat as statmod
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from orchard_async.capabilities import (
    EgressRule,
    Exposes,
    ExtendableTTL,
    FileRoot,
    NetworkControl,
    NetworkState,
    Ping,
    check_extension,
)
from orchard_async.errors import ConfigError, PathOutsideSandbox, SandboxLost
from orchard_async.kit import streams
from orchard_async.kit.egress import NetworkSwitch
from orchard_async.kit.expose import Exposures
from orchard_async.kit.shell import ShellClient, quote
from orchard_async.protocols import DEFAULT_EXEC_TIMEOUT
from orchard_async.types import ExecResult, FileInfo


class ShellSession:
    """A stateful shell inside a sandbox: ``cd`` and variables persist between commands."""

    def __init__(self, client: ShellClient, session_id: str):
        self._client = client
        self._id = session_id

    async def exec(
        self, cmd: str, *, timeout: float | None = DEFAULT_EXEC_TIMEOUT, stdin: bytes | None = None
    ) -> ExecResult:
        return await self._client.run(cmd, timeout=timeout, stdin=stdin, session=self._id)


class ShellSandbox:
    """The Sandbox contract over one long-lived shell.

    ``root`` bounds the paths file operations accept ("/" in a container, the private
    directory for the local adapter). ``on_close`` is the adapter's teardown.
    ``stream_opener`` is the adapter's way to start a command in the sandbox with its stdin
    and stdout attached (see ``orchard_async.kit.streams``); without one, ``open_stream`` is a
    ConfigError. ``network`` switches its egress (``kit.egress``); without one, ``set_network``
    is a ConfigError. ``ttl_extender`` moves the backend's expiry of the sandbox to the epoch
    seconds it is given (``extend_ttl``, up to ``max_extension`` seconds in all); without one,
    or with ``ttl_refusal`` (why it cannot here), ``extend_ttl`` is a ConfigError.
    """

    capabilities = frozenset({Ping, FileRoot, NetworkControl, Exposes, ExtendableTTL})

    def __init__(
        self,
        *,
        id: str,
        client: ShellClient,
        root: str,
        labels: dict[str, str],
        on_close: Callable[[], Awaitable[None]],
        expires_at: float,
        stream_opener: streams.StreamOpener | None = None,
        network: NetworkSwitch | None = None,
        ttl_extender: Callable[[float], Awaitable[None]] | None = None,
        max_extension: float = 0.0,
        ttl_refusal: str = "",
    ):
        self.id = id
        self.workdir = client.workdir
        self.root = root
        self.labels = labels
        self.expires_at = expires_at
        self._client = client
        self._on_close = on_close
        self._stream_opener = stream_opener
        self._network = network
        self._ttl_extender = ttl_extender
        self._ttl_refusal = ttl_refusal
        self.max_extension = max_extension
        self.extended = 0.0  # seconds extend_ttl has added so far
        self._ttl_lock: anyio.Lock | None = None  # made on the first extension (the loop's)
        self._sessions = 0
        self._exposures = Exposures(self)
        self.closed = False

    @property
    def spool_dir(self) -> str:
        """Where the shell server spools command output, as the sandbox sees the path."""
        return self._client.ctl_dir

    # -- commands ------------------------------------------------------------------------

    async def exec(
        self,
        cmd: str,
        *,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        return await self._client.run(
            cmd, timeout=timeout, cwd=self.resolve(cwd) if cwd else None, env=env, stdin=stdin
        )

    @asynccontextmanager
    async def session(self) -> AsyncIterator[ShellSession]:
        self._sessions += 1
        session_id = str(self._sessions)
        try:
            yield ShellSession(self._client, session_id)
        finally:
            if not self._client.lost:
                with anyio.CancelScope(shield=True):
                    await self._client.run(f"rm -f -- {quote(self._client.ctl_dir + '/s.' + session_id)}", timeout=10)

    # -- streams ---------------------------------------------------------------------------

    async def open_stream(self, argv: Sequence[str]) -> streams.SandboxStream:
        if self._stream_opener is None:
            raise ConfigError(f"sandbox {self.id}'s adapter cannot open streams into it")
        if self.closed or self._client.lost:
            raise SandboxLost(f"sandbox {self.id} is {'closed' if self.closed else 'lost'}: no stream into it")
        return await streams.start_stream(self, self._stream_opener, argv)

    async def connect(self, port: int) -> streams.SandboxStream:
        return await streams.connect(self, port)

    async def expose(self, port: int) -> str:
        """``http://127.0.0.1:N`` on the controller, relayed to ``port`` in the sandbox until
        ``unexpose(port)`` or the sandbox closes (``kit.expose``). Idempotent per port."""
        return await self._exposures.expose(port)

    async def unexpose(self, port: int) -> bool:
        return await self._exposures.unexpose(port)

    # -- network ---------------------------------------------------------------------------

    async def set_network(
        self, mode: str, allow: Sequence[EgressRule | Mapping[str, Any]] = (), *, revision: int | None = None
    ) -> NetworkState:
        if self.closed or self._client.lost:
            raise SandboxLost(f"sandbox {self.id} is {'closed' if self.closed else 'lost'}: its network is gone")
        return await self._switch().set(mode, allow, revision=revision)

    async def get_network(self) -> NetworkState:
        return self._switch().state

    def _switch(self) -> NetworkSwitch:
        if self._network is None:
            raise ConfigError(f"sandbox {self.id}'s adapter does not manage its network")
        return self._network

    # -- files -----------------------------------------------------------------------------

    def resolve(self, path: str) -> str:
        if "\0" in path:
            raise PathOutsideSandbox(f"path {path!r} contains a NUL byte")
        full = posixpath.normpath(posixpath.join(self.workdir, path))
        if not (self.root == "/" or full == self.root or full.startswith(self.root.rstrip("/") + "/")):
            raise PathOutsideSandbox(f"path {path!r} resolves to {full}, outside the sandbox ({self.root})")
        return full

    async def read_file(self, path: str) -> bytes:
        full = self.resolve(path)
        result = await self._client.run(f"cat -- {quote(full)}", timeout=DEFAULT_EXEC_TIMEOUT, uncapped=True)
        self._raise_for_file(result, full)
        return result.stdout

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        full = self.resolve(path)
        payload = data.encode() if isinstance(data, str) else data
        parent = posixpath.dirname(full)
        script = f"mkdir -p -- {quote(parent)} && cat > {quote(full)} && chmod {mode:o} {quote(full)}"
        result = await self._client.run(script, timeout=DEFAULT_EXEC_TIMEOUT, stdin=payload or None)
        self._raise_for_file(result, full)

    async def list_dir(self, path: str = ".") -> list[FileInfo]:
        full = self.resolve(path)
        script = f"cd -- {quote(full)} && find . -mindepth 1 -maxdepth 1 -exec stat -c '%s %f %Y %n' {{}} +"
        result = await self._client.run(script, timeout=DEFAULT_EXEC_TIMEOUT, uncapped=True)
        self._raise_for_file(result, full)
        entries = []
        for line in result.text.splitlines():
            size, mode_hex, mtime, name = line.split(" ", 3)
            mode = int(mode_hex, 16)
            name = name.removeprefix("./")
            entries.append(
                FileInfo(
                    name,
                    posixpath.join(full, name),
                    int(size),
                    statmod.S_ISDIR(mode),
                    statmod.S_IMODE(mode),
                    float(mtime),
                )
            )
        return sorted(entries, key=lambda entry: entry.name)

    async def ping(self, timeout: float) -> bool:
        """Whether the sandbox's shell answers, without running a command (ShellClient.ping):
        the warm pool's check before it hands a sandbox out."""
        return not self.closed and await self._client.ping(timeout)

    async def apply_patch(self, patch: str | bytes, *, cwd: str | None = None) -> ExecResult:
        """Apply a unified diff with ``git apply`` in a git work tree, else ``patch -p1``."""
        payload = patch.encode() if isinstance(patch, str) else patch
        script = (
            "if command -v git >/dev/null 2>&1 && git rev-parse --git-dir >/dev/null 2>&1; "
            "then git apply --whitespace=nowarn -; else patch -p1; fi"
        )
        return await self._client.run(
            script, timeout=DEFAULT_EXEC_TIMEOUT, cwd=self.resolve(cwd) if cwd else None, stdin=payload
        )

    @staticmethod
    def _raise_for_file(result: ExecResult, path: str) -> None:
        if result.reason.is_infra:
            raise SandboxLost(f"sandbox lost during a file operation on {path}: {result.error_text}")
        if result.exit_code != 0:
            message = result.error_text.strip() or f"exit code {result.exit_code}"
            if "No such file" in message or "can't cd" in message or "can't open" in message:
                raise FileNotFoundError(f"{path}: {message}")
            raise OSError(f"{path}: {message}")

    # -- lifetime --------------------------------------------------------------------------

    @property
    def remaining(self) -> float:
        return self.expires_at - time.time()

    async def extend_ttl(self, seconds: float) -> float:
        """Move the expiry ``seconds`` later (capabilities.ExtendableTTL); the new expiry."""
        if self.closed or self._client.lost or self.remaining <= 0:
            state = "closed" if self.closed else "lost" if self._client.lost else "past its TTL"
            raise SandboxLost(f"sandbox {self.id} is {state}: its TTL cannot be extended")
        check_extension(self.id, seconds, self.extended, self.max_extension)
        if self._ttl_extender is None or self._ttl_refusal:
            raise ConfigError(
                f"sandbox {self.id}'s TTL cannot be extended here: {self._ttl_refusal or 'its adapter has no way to'}"
            )
        # One at a time: two racing writes of the backend's expiry could land out of order.
        self._ttl_lock = self._ttl_lock or anyio.Lock()
        async with self._ttl_lock:
            check_extension(self.id, seconds, self.extended, self.max_extension)
            expires_at = self.expires_at + seconds
            await self._ttl_extender(expires_at)
            self.extended += seconds
            self.expires_at = expires_at
        return expires_at

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            await self._exposures.close()  # first: no new connection reaches a closing sandbox
            await self._on_close()

    async def __aenter__(self) -> ShellSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

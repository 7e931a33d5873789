"""The whole backend contract on one screen. Every adapter implements these; nothing else."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

from .types import ExecResult, FileInfo, SandboxSpec


@runtime_checkable
class Session(Protocol):
    """A stateful shell: working directory and variables carry over between commands."""

    async def exec(self, cmd: str, *, timeout: float | None = None, stdin: bytes | None = None) -> ExecResult: ...


@runtime_checkable
class Sandbox(Protocol):
    id: str
    workdir: str
    labels: dict[str, str]

    async def exec(
        self,
        cmd: str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None: ...

    async def list_dir(self, path: str = ".") -> list[FileInfo]: ...

    async def apply_patch(self, patch: str | bytes, *, cwd: str | None = None) -> ExecResult: ...

    def session(self) -> AbstractAsyncContextManager[Session]: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...


class SandboxRecord(Protocol):
    """What ``list_owned``/``reap`` see: enough to identify and remove a sandbox."""

    id: str
    labels: dict[str, str]


@runtime_checkable
class Adapter(Protocol):
    name: str

    async def create(self, spec: SandboxSpec) -> Sandbox: ...

    async def destroy(self, sandbox: Sandbox) -> None: ...

    async def list_owned(self) -> list[str]:
        """Ids of live sandboxes this adapter instance created and has not destroyed."""
        ...

    async def reap(self, older_than: float = 0.0) -> list[str]:
        """Remove sandboxes of dead or expired runs (any process's); return their ids."""
        ...

    async def close(self) -> None: ...

"""A sandbox that records: every call passes through to the real sandbox and is timed into the
trajectory's ops. What a task's ``setup``, ``evaluate`` and ``grade`` are handed (the episode's
own commands go to the sandbox directly: their step records their timing)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from orchard_async.protocols import Sandbox
from orchard_async.records.trajectory import Op
from orchard_async.types import ExecResult


class RecordingSandbox:
    """Passes every call through to the sandbox and times it into the trajectory's ops."""

    def __init__(self, inner: Sandbox, ops: list[Op], t0: float):
        self.inner = inner  # the sandbox itself: calls to it are not recorded
        self.ops = ops  # the trajectory's, shared by every recording sandbox of the attempt
        self.t0 = t0  # monotonic time the attempt began: ops start relative to it
        self.id = inner.id
        self.workdir = inner.workdir
        self.labels = inner.labels

    async def _timed(self, name: str, call: Any) -> Any:
        start = time.monotonic()
        try:
            result = await call
        except BaseException as exc:
            self.ops.append(Op(name, start - self.t0, time.monotonic() - start, type(exc).__name__))
            raise
        outcome = result.reason.value if isinstance(result, ExecResult) else "ok"
        self.ops.append(Op(name, start - self.t0, time.monotonic() - start, outcome))
        return result

    async def exec(self, cmd: str, **kwargs: Any) -> ExecResult:
        return await self._timed("exec", self.inner.exec(cmd, **kwargs))

    async def read_file(self, path: str) -> bytes:
        return await self._timed("read_file", self.inner.read_file(path))

    async def write_file(self, path: str, data: bytes | str, **kwargs: Any) -> None:
        return await self._timed("write_file", self.inner.write_file(path, data, **kwargs))

    async def list_dir(self, path: str = ".") -> Any:
        return await self._timed("list_dir", self.inner.list_dir(path))

    async def apply_patch(self, patch: str | bytes, **kwargs: Any) -> ExecResult:
        return await self._timed("apply_patch", self.inner.apply_patch(patch, **kwargs))

    def session(self) -> Any:
        return self.inner.session()

    async def open_stream(self, argv: Sequence[str]) -> Any:
        return await self._timed("open_stream", self.inner.open_stream(argv))

    async def connect(self, port: int) -> Any:
        return await self._timed("connect", self.inner.connect(port))

    async def close(self) -> None:
        await self.inner.close()

    async def __aenter__(self) -> RecordingSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

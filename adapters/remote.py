"""The remote adapter: sandboxes of an ``orchard-async serve`` service, over HTTP.

``get_adapter("remote", url=..., api_key=...)`` makes the whole library (rollout engine,
recipes, bench) run its sandboxes through a service: the trainer on one machine, the
sandboxes on a cluster. It speaks the service's Orchard-compatible API plus the
extensions the library's contract needs (``mode: native`` exec: sh semantics, stdin, exact
bytes in base64, the exit reason; sessions; a file listing's modes).

Retries are safe: a create names its sandbox (``ra-<random>``), so a retried create finds
the one already made, even by a restarted service that re-adopted it (a lost answer never
makes a second sandbox); a command carries an ``Idempotency-Key``, so a retried exec gets
the job already running, and a retry whose first attempt may have reached the service says
so (``X-Orchard-Retry``), so a service restarted meanwhile answers "outcome unknown" rather
than running the command a second time. Connection errors and 503s are retried for
``retry_for`` seconds (default 30: a service's restart fits; a 503's ``Retry-After`` is
honoured), a create's within its deadline too.

Streams (``open_stream``, ``connect``) go over the service's ``WS /sandboxes/{id}/exec/pty``
(one websocket per stream, JSON frames with the bytes in base64): the process runs in the
service's sandbox through that sandbox's own ``open_stream``, started by the same wrapper as
every adapter's (``kit.streams``), so its pid, a missing program and ``connect``'s relay behave
as they do there; its stderr is dropped, as everywhere.

Entering the adapter (``async with``) checks that something answers at ``url`` within a few
seconds (``REACH_FOR``): a wrong URL is one clear error, not minutes of retried creates.

Defaults: ``url`` from ``ORCHARD_REMOTE_URL`` (else ``SANDBOX_BASE_URL``, else
``http://127.0.0.1:8000``), ``api_key`` from ``ORCHARD_REMOTE_KEY`` (else ``SANDBOX_API_KEY``).
"""

from __future__ import annotations

import base64
import math
import os
import posixpath
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import anyio.abc
import msgspec

from orchard_async.capabilities import (
    Doctor,
    EgressRule,
    Exposes,
    FileRoot,
    NetworkConflict,
    NetworkControl,
    NetworkState,
    network_policy,
)
from orchard_async.errors import (
    AdapterUnavailable,
    BackendUnavailable,
    ConfigError,
    CreateFailed,
    PathOutsideSandbox,
    SandboxLost,
)
from orchard_async.kit import streams
from orchard_async.kit.deadline import explained_deadline
from orchard_async.kit.expose import Exposures
from orchard_async.kit.retry import Attempts, Backoff, retry_after
from orchard_async.protocols import DEFAULT_EXEC_TIMEOUT
from orchard_async.types import ExecResult, ExitReason, FileInfo, SandboxSpec, check_env, check_timeout

RETRY_FOR = 30.0  # seconds a call retries a service that does not answer, or answers 503
NO_ANSWER_BACKOFF = Backoff(0.25, cap=2.0)  # between retries of a call that got no answer
MAX_RETRY_AFTER = 30.0
DOCTOR_RETRY_FOR = 2.0  # `doctor` says at once that no service answers
# Entering the adapter: how long a service that does not answer at all may take to start
# (one that answers anything, even an error, is there). Seconds, not retry_for: a wrong URL is
# the user's mistake, said at once, before the first sandbox.
REACH_FOR = 3.0
WAIT_STEP = 300  # seconds per /wait call while a sandbox is being made
HTTP_MARGIN = 60.0  # beyond a command's own timeout before the HTTP call gives up
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0  # a call without a timeout of its own: the longest wait for the next bytes
DEFAULT = object()  # a call's timeout: the client's default (READ_TIMEOUT between bytes)
# Connection errors and client timeouts: the service did not answer (retried).
TRANSPORT_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)
STDIN_FRAME = 1 << 20  # bytes of stdin per frame: well under the service's 4 MiB frames once in base64
# What the service's PTY socket closes with before a process starts (apps/serve/pty.py): the
# error each means here.
REFUSED = {
    4400: ConfigError,  # a bad init frame
    4401: ConfigError,  # no or a bad API key
    4404: SandboxLost,
    4409: BackendUnavailable,  # not ready: being re-adopted by a restarted service
    4500: SandboxLost,  # the service's sandbox could not start the process
    4501: ConfigError,  # the service's adapter has no streams (sim)
}


class Answer:
    """An HTTP answer, read whole."""

    def __init__(self, status: int, headers: Any, body: bytes):
        self.status_code = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class ServiceStream(anyio.abc.ByteStream):
    """stdin and stdout of a process in a service's sandbox: its PTY websocket, once the
    service said ``ready``. The process's end is the ``exit`` frame; closing the socket ends
    the process (the service kills it)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self._ws = ws
        self._received = b""  # decoded past what a receive returned
        self._ended = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._received:
            if self._ended:
                raise anyio.EndOfStream
            if self._ws.closed:
                raise anyio.ClosedResourceError
            message = await self._ws.receive()
            if message.type is aiohttp.WSMsgType.TEXT:
                frame = msgspec.json.decode(message.data)
                if frame.get("type") == "stdout":
                    self._received = base64.b64decode(frame.get("data", ""))
                elif frame.get("type") == "exit":
                    self._ended = True
                elif frame.get("type") == "error":
                    raise anyio.BrokenResourceError(f"the service: {frame.get('message')}")
            elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                raise anyio.BrokenResourceError(
                    f"the service closed the stream before the process ended ({message.extra})"
                )
            elif message.type is aiohttp.WSMsgType.ERROR:
                raise anyio.BrokenResourceError(f"the stream to the service failed: {message.data!r}")
        chunk, self._received = self._received[:max_bytes], self._received[max_bytes:]
        return chunk

    async def _send(self, frame: dict[str, Any]) -> None:
        if self._ws.closed:
            raise anyio.ClosedResourceError
        try:
            await self._ws.send_str(msgspec.json.encode(frame).decode())  # the service reads text frames
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise anyio.BrokenResourceError(f"the stream to the service is gone ({exc!r})") from None

    async def send(self, item: bytes) -> None:
        for start in range(0, len(item), STDIN_FRAME):
            await self._send({"type": "stdin", "data": _b64(item[start : start + STDIN_FRAME])})

    async def send_eof(self) -> None:
        await self._send({"type": "eof"})

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CONNECT_TIMEOUT):
            await self._ws.close()


class RemoteSession:
    """A stateful shell of a remote sandbox (held by the service)."""

    def __init__(self, sandbox: RemoteSandbox, session_id: str):
        self._sandbox = sandbox
        self.id = session_id

    async def exec(
        self, cmd: str, *, timeout: float | None = DEFAULT_EXEC_TIMEOUT, stdin: bytes | None = None
    ) -> ExecResult:
        return await self._sandbox._exec(cmd, timeout=timeout, stdin=stdin, session=self.id)


def _network_state(answer: dict[str, Any]) -> NetworkState:
    """The service's network answer (Orchard's shape, with our ``revision``)."""
    policy = network_policy(answer["mode"], answer.get("allowlist") or [])
    return NetworkState(mode=policy.mode, allow=policy.allow, revision=int(answer.get("revision") or 0))


class RemoteSandbox:
    capabilities = frozenset({FileRoot, NetworkControl, Exposes})

    def __init__(self, adapter: RemoteAdapter, info: dict[str, Any]):
        self._adapter = adapter
        self.id: str = info["sandbox_id"]
        self.workdir: str = info.get("workdir") or "/workspace"
        self.root: str = info.get("root") or "/"
        self.labels: dict[str, str] = info.get("labels") or {}
        self.expires_at: float = info.get("expires_at") or 0.0
        self._exposures = Exposures(self)
        self.closed = False

    @property
    def _path(self) -> str:
        return f"/sandboxes/{self.id}"

    # -- commands ----------------------------------------------------------------------------

    async def exec(
        self,
        cmd: str,
        *,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        return await self._exec(cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin)

    async def _exec(self, cmd: str, *, timeout: float | None, stdin: bytes | None, **fields: Any) -> ExecResult:
        check_timeout(timeout)
        check_env(fields.get("env"))
        if "\0" in cmd or "\0" in (fields.get("cwd") or ""):
            raise ConfigError("commands and paths cannot contain NUL bytes")
        body = {"command": cmd, "mode": "native", "timeout_seconds": timeout, "wait": True, **fields}
        if stdin:
            body["stdin"] = _b64(stdin)
        http_timeout = None if timeout is None else timeout + HTTP_MARGIN
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        try:
            job = await self._adapter._call(
                "POST", f"{self._path}/exec", json=body, timeout=http_timeout, headers=headers
            )
            while job["status"] not in ("succeeded", "failed"):  # past the service's wait window
                job = await self._adapter._call("GET", f"/jobs/{job['job_id']}/wait", params={"timeout": WAIT_STEP})
        except SandboxLost as exc:
            return ExecResult(exit_code=-1, reason=ExitReason.SANDBOX_LOST, stderr=str(exc).encode())
        except BackendUnavailable as exc:
            return ExecResult(exit_code=-1, reason=ExitReason.INFRA_ERROR, stderr=str(exc).encode())
        if "reason" not in job:  # the service could not run it at all
            reason = ExitReason.INFRA_ERROR
            return ExecResult(exit_code=-1, reason=reason, stderr=(job.get("error") or "").encode())
        return ExecResult(
            exit_code=job["exit_code"],
            reason=ExitReason(job["reason"]),
            stdout=base64.b64decode(job["stdout"]),
            stderr=base64.b64decode(job["stderr"]),
            duration=job.get("duration") or 0.0,
            stdout_cut=job.get("stdout_cut") or 0,
            stderr_cut=job.get("stderr_cut") or 0,
        )

    # -- network ---------------------------------------------------------------------------

    async def set_network(
        self, mode: str, allow: Sequence[EgressRule | Mapping[str, Any]] = (), *, revision: int | None = None
    ) -> NetworkState:
        policy = network_policy(mode, allow)  # a bad rule is refused here, before any request
        body: dict[str, Any] = {"mode": policy.mode, "allowlist": [msgspec.to_builtins(rule) for rule in policy.allow]}
        if revision is not None:
            body["revision"] = revision
        return _network_state(await self._adapter._call("PUT", f"{self._path}/network", json=body))

    async def get_network(self) -> NetworkState:
        return _network_state(await self._adapter._call("GET", f"{self._path}/network"))

    @asynccontextmanager
    async def session(self) -> AsyncIterator[RemoteSession]:
        opened = await self._adapter._call("POST", f"{self._path}/sessions")
        try:
            yield RemoteSession(self, opened["session_id"])
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self._adapter._call("DELETE", f"{self._path}/sessions/{opened['session_id']}")
                except (SandboxLost, FileNotFoundError, BackendUnavailable):
                    pass  # the sandbox (and its sessions) went first

    # -- streams -----------------------------------------------------------------------------

    async def open_stream(self, argv: Sequence[str]) -> streams.SandboxStream:
        return await streams.start_stream(self, self._adapter._open_stream, argv)

    async def connect(self, port: int) -> streams.SandboxStream:
        return await streams.connect(self, port)

    async def expose(self, port: int) -> str:
        """As ``ShellSandbox.expose``: a loopback URL on this controller, over ``connect``."""
        return await self._exposures.expose(port)

    async def unexpose(self, port: int) -> bool:
        return await self._exposures.unexpose(port)

    # -- files -------------------------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        got = await self._adapter._call("GET", f"{self._path}/files", params={"path": path}, file=True)
        return base64.b64decode(got["content"])

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        payload = data.encode() if isinstance(data, str) else data
        body = {"path": path, "content": _b64(payload), "mode": mode}
        await self._adapter._call("POST", f"{self._path}/files", json=body, file=True)

    async def list_dir(self, path: str = ".") -> list[FileInfo]:
        listed = await self._adapter._call("GET", f"{self._path}/files/list", params={"path": path}, file=True)
        return [
            FileInfo(
                entry["name"],
                entry.get("full_path") or posixpath.join(path, entry["name"]),
                entry["size"],
                entry["type"] == "directory",
                entry.get("mode", 0),
                entry.get("mtime", 0.0),
            )
            for entry in listed["files"]
        ]

    async def apply_patch(self, patch: str | bytes, *, cwd: str | None = None) -> ExecResult:
        text = patch.decode() if isinstance(patch, bytes) else patch
        body = {"patch": text, "timeout_seconds": DEFAULT_EXEC_TIMEOUT, "cwd": cwd}
        result = await self._adapter._call("POST", f"{self._path}/apply_patch", json=body, file=True)
        return ExecResult(
            exit_code=result["exit_code"],
            reason=ExitReason.OK if result["success"] else ExitReason.NONZERO,
            stdout=result["stdout"].encode(),
            stderr=result["stderr"].encode(),
        )

    # -- lifetime ----------------------------------------------------------------------------

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._adapter._live.pop(self.id, None)
        with anyio.CancelScope(shield=True):
            await self._exposures.close()
            try:
                await self._adapter._call("DELETE", self._path)
            except SandboxLost:
                pass  # already gone (its TTL, or the service reaped it)

    async def __aenter__(self) -> RemoteSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class RemoteAdapter:
    name = "remote"
    capabilities = frozenset({Doctor})

    def __init__(
        self,
        *,
        url: str | None = None,
        api_key: str | None = None,
        max_connections: int = 256,
        retry_for: float = RETRY_FOR,
    ):
        self.url = (
            url or os.environ.get("ORCHARD_REMOTE_URL") or os.environ.get("SANDBOX_BASE_URL") or "http://127.0.0.1:8000"
        ).rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"url must start with http:// or https://, got {self.url!r}")
        key = api_key or os.environ.get("ORCHARD_REMOTE_KEY") or os.environ.get("SANDBOX_API_KEY")
        # aiohttp, not httpx: at 64 callers httpx's pool made the tail seconds long (p99 10.6 s
        # for GET /health on loopback, aiohttp's 0.8 s; docs/performance.md, "The service's overhead"). Made on first
        # use: a session belongs to the event loop it is made in.
        self._headers = {"X-API-Key": key} if key else {}
        self._max_connections = max_connections
        if not 0 <= retry_for <= 3600:
            raise ConfigError(f"retry_for must be between 0 and 3600 seconds, got {retry_for}")
        self.retry_for = retry_for
        self._session: aiohttp.ClientSession | None = None
        self._live: dict[str, RemoteSandbox] = {}

    async def doctor(self) -> str:
        try:
            health = await self._call("GET", "/health", until=anyio.current_time() + DOCTOR_RETRY_FOR)
        except (BackendUnavailable, ConfigError) as exc:
            raise AdapterUnavailable(f"no orchard-async service answers at {self.url} ({exc})") from None
        return f"the service at {self.url} ({health.get('adapter', '?')} adapter behind it)"

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None | object = DEFAULT,
        file: bool = False,
        until: float | None = None,
    ) -> dict[str, Any]:
        """One API call, retried on connection errors and 503; errors mapped to the library's.
        ``file``: a 404 names a missing file rather than a missing sandbox."""
        response = await self._retrying(
            method, path, json=json, params=params, headers=headers, timeout=timeout, until=until
        )
        return self._answer(response, file)

    async def _retrying(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None | object = DEFAULT,
        until: float | None = None,
    ) -> Answer:
        """The call's answer, after retrying connection errors and 503s until ``until`` (default:
        ``retry_for`` seconds from now). Every call the library makes is safe to repeat: reads,
        DELETEs, creates (they name their sandbox) and execs (``Idempotency-Key``)."""
        attempts = Attempts(
            NO_ANSWER_BACKOFF, deadline=anyio.current_time() + self.retry_for if until is None else until
        )
        reached = False
        while True:
            sent = dict(headers or {})
            if reached and "Idempotency-Key" in sent:
                sent["X-Orchard-Retry"] = "1"  # the first attempt may have run (see jobs.py)
            try:
                response = await self._request(method, path, json=json, params=params, headers=sent, timeout=timeout)
            except TRANSPORT_ERRORS as exc:
                # a refused connection reached nothing; any other failure may have come after the request
                reached = reached or not isinstance(exc, aiohttp.ClientConnectorError)
                pause = attempts.next_pause()
                if pause is None:
                    raise BackendUnavailable(f"the service at {self.url} did not answer: {exc!r}") from None
                await anyio.sleep(pause)
                continue
            if response.status_code == 503:
                # the service answered: its Retry-After paces the next try, not the backoff
                asked = retry_after(response.headers.get("Retry-After"))
                wait = min(1.0 if asked is None else asked, MAX_RETRY_AFTER)
                if attempts.fits(wait):
                    await anyio.sleep(wait)
                    continue
            return response

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None | object = DEFAULT,
    ) -> Answer:
        """One HTTP exchange, its body read whole. Raises TRANSPORT_ERRORS."""
        if timeout is DEFAULT:
            limits = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT)
        else:
            limits = aiohttp.ClientTimeout(total=timeout, sock_connect=CONNECT_TIMEOUT)  # type: ignore[arg-type]
        query = {name: str(value) for name, value in params.items()} if params else None
        async with self._http().request(
            method, self.url + path, json=json, params=query, headers=headers, timeout=limits
        ) as response:
            return Answer(response.status, response.headers, await response.read())

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=self._max_connections),
                json_serialize=lambda value: msgspec.json.encode(value).decode(),
            )
        return self._session

    async def _open_stream(self, sandbox: RemoteSandbox, command: list[str]) -> ServiceStream:
        """``command`` running in the service's sandbox, its stdin and stdout over the PTY socket
        (stderr dropped). A connection refused is retried for ``retry_for`` seconds, as calls are
        (nothing started); anything later is not retried: the process may have started."""
        url = f"{self.url}{sandbox._path}/exec/pty"
        init = {"type": "init", "cmd": ["sh", "-c", 'exec "$@" 2>/dev/null', "orchard-stream", *command]}
        attempts = Attempts(NO_ANSWER_BACKOFF, deadline=anyio.current_time() + self.retry_for)
        said = ""  # what the service's error frame said before it closed the socket
        try:
            with anyio.fail_after(self.retry_for + CONNECT_TIMEOUT + streams.START_TIMEOUT):
                while True:
                    try:
                        ws = await self._http().ws_connect(url)
                        break
                    except aiohttp.ClientConnectorError:
                        pause = attempts.next_pause()
                        if pause is None:
                            raise
                        await anyio.sleep(pause)
                try:
                    await ws.send_str(msgspec.json.encode(init).decode())
                    while True:
                        message = await ws.receive()
                        if message.type is not aiohttp.WSMsgType.TEXT:
                            break
                        frame = msgspec.json.decode(message.data)
                        if frame.get("type") == "ready":
                            return ServiceStream(ws)
                        said = frame.get("message") or said
                except BaseException:
                    with anyio.CancelScope(shield=True):
                        await ws.close()
                    raise
        except (*TRANSPORT_ERRORS, aiohttp.WSServerHandshakeError) as exc:
            raise BackendUnavailable(
                f"no stream into {sandbox.id}: the service at {self.url} did not answer ({exc!r})"
            ) from None
        await ws.close()
        code = message.data if message.type is aiohttp.WSMsgType.CLOSE else 0
        why = said or message.extra or f"the socket ended ({message.type.name})"
        raise REFUSED.get(code, BackendUnavailable)(f"no stream into {sandbox.id}: {why}")

    def _answer(self, response: Answer, file: bool) -> dict[str, Any]:
        try:
            body = response.json()
        except msgspec.DecodeError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        if response.status_code < 400:
            return body
        detail = body.get("detail") or f"HTTP {response.status_code}"
        reason = body.get("reason", "")
        status = response.status_code
        if status in (401, 403):
            raise ConfigError(f"the service refused the API key: {detail}")
        if reason == "path_outside":
            raise PathOutsideSandbox(detail)
        if reason == "network_conflict":
            raise NetworkConflict(detail)
        if reason == "no_such_file" or (file and status == 404 and reason != "unknown_sandbox"):
            raise FileNotFoundError(detail)
        if status in (404, 410):
            raise SandboxLost(detail)
        if status in (400, 409, 413, 422):
            if file:
                raise OSError(detail)
            raise ConfigError(detail)
        raise BackendUnavailable(f"the service answered {status}: {detail}")

    async def create(self, spec: SandboxSpec) -> RemoteSandbox:
        # The create timeout is the caller's (the pool's, see pool.py): give up a little
        # before it, so that the error names the sandbox and what the service last said.
        deadline, budget = explained_deadline()
        body = {
            "image": spec.image,
            "block_network": spec.network == "none",
            "sandbox_id": f"ra-{uuid.uuid4().hex[:16]}",  # ours: a retried create finds the first
            "cpu": spec.cpu,
            "memory": spec.memory,
            "timeout": math.ceil(spec.ttl),
            "env": spec.env,
            "labels": spec.labels,
            "workdir": spec.workdir,
            "pids": spec.pids,
            # sent only when asked for: a service from before them would refuse the fields
            **({"writable_dirs": list(spec.writable_dirs)} if spec.writable_dirs else {}),
            **({"gpus": spec.gpus} if spec.gpus else {}),
            **({"switch_users": True} if spec.switch_users else {}),
        }
        # Retried with the same id (a lost answer finds the sandbox it made), while the caller waits.
        until = min(deadline, anyio.current_time() + max(self.retry_for, 0.0))
        try:
            made = await self._call("POST", "/sandboxes", json=body, until=until)
        except (BackendUnavailable, SandboxLost) as exc:
            raise CreateFailed(f"the service could not create a sandbox: {exc}") from None
        sandbox_id = made["sandbox_id"]
        # Registered before it is ready: a cancelled or failed wait still deletes it in close().
        sandbox = RemoteSandbox(self, made)
        self._live[sandbox_id] = sandbox
        info, posted_again = made, False
        try:
            with anyio.fail_after(deadline - anyio.current_time()):
                while info["status"] == "pending":
                    try:
                        info = await self._wait(sandbox_id)
                    except SandboxLost:
                        if posted_again:
                            raise
                        # The service forgot it: it restarted before the sandbox was made, or lost
                        # it in the restart. The same create again, under the same id: never two.
                        posted_again = True
                        until = min(deadline, anyio.current_time() + max(self.retry_for, 0.0))
                        info = await self._call("POST", "/sandboxes", json=body, until=until)
        except BaseException as exc:
            await self._discard(sandbox)
            if isinstance(exc, TimeoutError):
                said = info.get("status_message") or info["status"]
                raise CreateFailed(f"sandbox {sandbox_id} was not ready within {budget:.3g}s: {said}") from None
            if isinstance(exc, BackendUnavailable | SandboxLost):
                raise CreateFailed(f"sandbox {sandbox_id}: {exc}") from None
            raise
        if info["status"] != "ready":
            await self._discard(sandbox)
            raise CreateFailed(f"sandbox {sandbox_id} failed: {info.get('status_message') or info['status']}")
        ready = RemoteSandbox(self, info)
        self._live[sandbox_id] = ready
        return ready

    async def _discard(self, sandbox: RemoteSandbox) -> None:
        """Delete a sandbox whose create failed. A service that does not answer cannot make the
        create's own error worse: the sandbox ends at its TTL (or went with the service)."""
        try:
            await sandbox.close()
        except BackendUnavailable:
            pass

    async def _wait(self, sandbox_id: str) -> dict[str, Any]:
        """One ``/wait``; connection errors and 503s retried (a restarted service re-adopting the
        sandbox answers 503 until it is back)."""
        response = await self._retrying(
            "GET", f"/sandboxes/{sandbox_id}/wait", params={"timeout": WAIT_STEP}, timeout=WAIT_STEP + HTTP_MARGIN
        )
        if response.status_code == 408:
            return {"status": "pending"}
        return self._answer(response, file=False)

    async def list_owned(self) -> list[str]:
        return list(self._live)

    async def reap(self, older_than: float = 0.0) -> list[str]:
        """Nothing to do here: the service reaps its own (TTL, idle limit, restarts)."""
        return []

    async def close(self) -> None:
        async with anyio.create_task_group() as tg:
            for sandbox in list(self._live.values()):
                tg.start_soon(sandbox.close)
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> RemoteAdapter:
        await self.check_reachable()
        return self

    async def check_reachable(self, within: float = REACH_FOR) -> None:
        """AdapterUnavailable, naming the URL, when nothing answers there within ``within``
        seconds. Any HTTP answer will do (a key, a sandbox, are each call's to check)."""
        attempts = Attempts(NO_ANSWER_BACKOFF, deadline=anyio.current_time() + within)
        while True:
            try:
                await self._request("GET", "/health", timeout=within)
                return
            except TRANSPORT_ERRORS as exc:
                pause = attempts.next_pause()
                if pause is None:
                    await self.close()  # the caller's `async with` never entered: nothing else closes it
                    raise AdapterUnavailable(
                        f"no orchard-async service answers at {self.url} ({exc or type(exc).__name__}); start one "
                        "with `orchard-async serve`, or give its url (adapter option url, or ORCHARD_REMOTE_URL)"
                    ) from None
                await anyio.sleep(pause)

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

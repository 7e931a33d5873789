"""The kubernetes adapter: one pod per sandbox, driven over one long-lived exec websocket.

Layout on the cluster. Every sandbox of a run is a pod in one namespace (``orchard`` by
default; created if missing). The namespace gets one NetworkPolicy, created once, that
denies all egress of every sandbox pod in it (selector: label ``orchard.sandbox`` exists);
a sandbox whose spec says ``network="on"`` gets its own policy allowing egress for that pod
alone (NetworkPolicies add up). Each pod:

* runs the image with the spec's pull policy (missing -> IfNotPresent, never -> Never,
  always -> Always), cpu/memory as requests and limits, the spec's env and labels, plus
  ``orchard.owner``, ``orchard.run``, ``orchard.expires`` (epoch seconds),
  ``orchard.controller`` (``<host>.<pid>.<process start time>``) and ``orchard.sandbox``;
* has ``activeDeadlineSeconds`` = TTL (the kubelet kills it even if nobody else does),
  ``automountServiceAccountToken: false``, ``enableServiceLinks: false`` and
  ``shareProcessNamespace: true`` (the pause container is PID 1 and reaps the zombies of
  commands);
* drops every capability (the shell protocol needs none), sets
  ``allowPrivilegeEscalation: false`` (no-new-privileges) and the runtime's default seccomp
  profile. ``spec.pids`` is NOT enforced per sandbox: Kubernetes limits pids per pod only
  node-wide (the kubelet's ``--pod-max-pids``; the CI cluster sets 1024), which ``doctor``
  says;
* images that ``orchard-async images build`` makes are on no registry: with pull "missing"
  they are never pulled (``Never``), and one that is not on the node is an ``ImageMissing``
  (a ConfigError naming the build command), remembered per image;
* runs as its main process a self-destruct timer (``sleep``): it waits the attach grace,
  and goes on to the rest of the TTL only if a shell attached (a controller killed between
  creating the pod and attaching leaves nothing running for long).

Readiness comes from ONE watch per adapter (an informer: pod phase, container states and
scheduling conditions in memory; reconnects with backoff, resumes from the last
resourceVersion, relists on 410 Gone). ``create`` returns when the pod is Running and its
shell answers. Image pull failures, container start errors and crash loops fail the create
at once; an unschedulable pod fails at the create timeout; either way the error carries the
pod's waiting message and latest warning event, and the pod is deleted.

The hot path is the core's shell-session protocol (orchard_async.shell) over one exec
websocket per sandbox (``sh -s``, kubernetes-asyncio's ``WsApiClient``): one frame per
command, no new websocket. Files and patches are commands on the same session. A timeout
interrupts the shell with a second, short exec (``kill -USR1 <pid>``). The transport is a
small interface (``Transport``): an agent inside the pod reached over the pod IP can replace
the exec websocket without touching the core. The exec's ``sh`` is wrapped so that when the
websocket closes (the controller died, even by SIGKILL) every process in the pod is killed
and the pod ends.

Control-plane load: API calls go through one gate (``max_api`` at once), each attempt under
a timeout, retried with exponential backoff and jitter on 429 (honouring Retry-After), 5xx
and connection errors; creates in flight are bounded by ``max_creating``.

Cleanup: ``destroy`` deletes the pod with grace 0 and background propagation (one API call;
the kubelet tears the containers down after). ``reap`` lists orchard pods by label and
removes those whose TTL passed, that ended, or whose controller process is dead (when it ran
on this host); a failed list raises before anything is deleted.

Config: ``kubeconfig=`` or ``KUBECONFIG`` or ``~/.kube/config`` (``context=`` or
``ORCHARD_K8S_CONTEXT`` selects a context), else the in-cluster service account.
Uses only core/v1 and networking.k8s.io/v1 (Kubernetes 1.20 and later).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import re
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import anyio
import anyio.abc
import msgspec
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.stream import WsApiClient

from orchard_async.errors import (
    AdapterUnavailable,
    BackendUnavailable,
    ConfigError,
    CreateFailed,
    OrchardError,
    SandboxLost,
)
from orchard_async.images import ImageMissing, build_command, missing_image_hint
from orchard_async.lease import CONTROLLER_LABEL, process_start_time
from orchard_async.protocols import Sandbox
from orchard_async.sandbox import ShellSandbox
from orchard_async.shell import READY_TIMEOUT, CgroupShellClient, ShellClient, quote
from orchard_async.types import DEFAULT_OUTPUT_CAP, SandboxSpec

DEFAULT_NAMESPACE = "orchard"
DEFAULT_IMAGE = "local/busybox:1"
DEFAULT_WORKDIR = "/workspace"
CTL_DIR = "/tmp/.orchard"  # the shell protocol's scratch files
OUT_DIR = f"{CTL_DIR}/out"  # the output FIFOs the relays copy to the controller
SHELL_PID = f"{CTL_DIR}/shell.pid"
CONTAINER = "sandbox"
DENY_POLICY = "orchard-deny-egress"
IMAGE_HINT = (
    "check the image name; on a cluster without a registry import it into the node's runtime "
    "(`orchard-async images build --adapter kubernetes` on a one-node cluster)"
)
# waiting reasons that say the image is not there and will not be: the user's to fix
IMAGE_ABSENT = ("ErrImageNeverPull", "InvalidImageName")

API_TIMEOUT = 30.0  # one attempt of one API call
API_RETRY_FOR = 60.0  # how long one call retries 429/5xx/connection errors
DELETE_RETRY_FOR = 10.0  # shorter for deletes: the caller waits; close() and reap retry later
CREATE_TIMEOUT = 180.0  # pod POST to shell answering
ATTACH_GRACE = 120.0  # the timer's wait for a shell before the pod ends itself
INTERRUPT_TIMEOUT = 10.0
WATCH_SECONDS = 240  # server-side timeout of one watch request; then it is resumed
SEND_CHUNK = 256 * 1024  # stdin bytes per websocket message
SEND_TIMEOUT = 30.0
SEND_RATE = 1e6  # bytes per second assumed for big frames (file writes)
STDERR_KEPT = 4096
SETUP_FAILED = "@@ORCHARD-SETUP-FAILED"

# container waiting reasons that no amount of waiting fixes: the create fails at once
FATAL_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
    "PreStartHookError",
    "PostStartHookError",
}

# The pod's main process: the self-destruct timer. `$1` the attach grace, `$2` the rest of
# the TTL, `$3` the file the shell writes its pid to when it starts.
TIMER = 'sleep "$1"; if [ -e "$3" ]; then exec sleep "$2"; fi'

# The exec's command: the protocol shell, wrapped so that the pod ends with it. `cat` relays
# stdin and sees EOF as soon as the websocket closes (the controller closed it or died), even
# while a command runs; if the shell dies, its side notices. Either side then kills every
# process in the pod's shared PID namespace but the pause container (PID 1), the timer among
# them, and the pod ends.
SHELL_ENDS_POD = ["sh", "-c", "{ cat; kill -KILL -1; } | { sh -s; kill -KILL -1; }"]
SHELL_ONLY = ["sh", "-s"]

# Command output never lands on the pod's disk (a command printing 2 GB must not fill the
# node's): the server points a command's stdout and stderr at two FIFOs, and one exec per
# FIFO relays it to the controller (the shell protocol's relay mode, orchard_async.shell),
# which keeps the head and tail and counts the rest. Each relay makes its FIFO, says it is
# ready, and becomes `cat` holding the FIFO open read-write (no end between commands). It is
# read only while a command runs: between commands the websocket's buffers fill, then the
# FIFO, and a background writer blocks. `$1` the FIFO's directory, `$2` its name.
RELAY = (
    'mkdir -p "$1" && { [ -p "$1/$2" ] || mkfifo -m 600 "$1/$2"; } && printf "@@RELAY %s\\n" "$2" && exec cat <>"$1/$2"'
)


_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]")


# -- identities and labels ----------------------------------------------------------------


def label_value(text: str) -> str:
    """``text`` as a valid label value: [A-Za-z0-9_.-], at most 63, alphanumeric ends."""
    value = _LABEL_VALUE_BAD.sub("_", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def controller_identity() -> dict[str, str]:
    """This process as reap sees it: host, PID namespace, pid and start time."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "pidns": _pid_namespace(),
        "pid": str(pid),
        "start": process_start_time(pid) or "0",
    }


def controller_label(identity: dict[str, str]) -> str:
    """``<host>.<pid>.<start time>`` as a label value (the host shortened to fit)."""
    tail = f".{identity['pid']}.{identity['start']}"
    host = label_value(identity["host"])[: 63 - len(tail)].rstrip("-_.") or "host"
    return host + tail


def controller_alive(annotation: str | None) -> bool | None:
    """Is the controller named by a pod's ``orchard/controller`` annotation alive? None when
    this process cannot tell (another host or PID namespace): then only the expiry decides."""
    try:
        ident = json.loads(annotation or "")
        host, pidns, pid, start = ident["host"], ident["pidns"], int(ident["pid"]), ident["start"]
    except (ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname() or pidns != _pid_namespace():
        return None
    return process_start_time(pid) == start


# -- API errors ----------------------------------------------------------------------------


class ApiError(Exception):
    """A non-2xx answer of the API server, with its Status object's reason and message."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


def _retryable(exc: ApiError) -> bool:
    if exc.status == 429 or exc.status >= 500:
        return True
    # A namespace the adapter just created has no default ServiceAccount for a moment.
    return exc.status == 403 and "serviceaccount" in exc.message.replace(" ", "").lower() and "not found" in exc.message


# -- pod state, as the watch sees it --------------------------------------------------------


def pod_verdict(pod: dict[str, Any]) -> tuple[str, str]:
    """("ready" | "pending" | "failed", why) for a pod being created."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    containers = {c.get("name"): c for c in status.get("containerStatuses") or []}
    state = (containers.get(CONTAINER) or {}).get("state") or {}
    if phase in ("Failed", "Succeeded"):
        term = state.get("terminated") or {}
        why = status.get("reason") or term.get("reason") or phase
        message = status.get("message") or term.get("message") or ""
        if term:
            message = f"{message} (container exit code {term.get('exitCode')})".strip()
        return "failed", f"pod {phase.lower()}: {why}: {message}".rstrip(": ")
    if "waiting" in state:
        waiting = state["waiting"] or {}
        reason = waiting.get("reason") or ""
        if reason in FATAL_WAITING:
            return "failed", f"{reason}: {waiting.get('message') or ''}".rstrip(": ")
        if reason:
            return "pending", f"{reason}: {waiting.get('message') or ''}".rstrip(": ")
    if "terminated" in state:
        term = state["terminated"] or {}
        return (
            "failed",
            f"container ended: {term.get('reason')}: {term.get('message') or ''} (exit code {term.get('exitCode')})",
        )
    if phase == "Running" and "running" in state:
        return "ready", "running"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return "pending", f"{cond.get('reason') or 'not scheduled'}: {cond.get('message') or ''}".rstrip(": ")
    return "pending", f"phase {phase}"


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): relist."""


class PodInformer:
    """One watch over this adapter's pods, kept in memory (pod dicts by name).

    Runs as a background task: list, then watch from the list's resourceVersion; on a clean
    end of the watch resume from the last version seen, on an error reconnect with backoff,
    on 410 Gone relist. Every change to a pod wakes whoever waits on it; a relist wakes
    everyone (changes during the outage were not seen one by one).
    """

    def __init__(self, adapter: KubernetesAdapter, selector: str):
        self._adapter = adapter
        self.selector = selector
        self.pods: dict[str, dict[str, Any]] = {}
        self.creating: set[str] = set()  # pods whose create waits on this watch
        self.gone: set[str] = set()  # of those, deleted while we watched: their create fails
        self._waiters: dict[str, anyio.Event] = {}
        self.synced = anyio.Event()
        self.connected = False
        self.lists = 0
        self.watches = 0
        self.errors = 0
        self.gone_410 = 0
        self.last_error = ""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def changed(self, name: str) -> anyio.Event:
        """An event set at the next change of pod ``name`` (or any relist)."""
        event = self._waiters.get(name)
        if event is None:
            event = self._waiters[name] = anyio.Event()
        return event

    def _notify(self, name: str) -> None:
        event = self._waiters.pop(name, None)
        if event is not None:
            event.set()

    def _notify_all(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for event in waiters.values():
            event.set()

    async def _run(self) -> None:
        version: str | None = None
        backoff = 0.2
        while True:
            try:
                if version is None:
                    version = await self._relist()
                version = await self._watch(version)
                backoff = 0.2
            except _Gone:
                self.gone_410 += 1
                version = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure of the connection: reconnect
                self.connected = False
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 5.0)

    async def _relist(self) -> str:
        pods: dict[str, dict[str, Any]] = {}
        version, token = "", ""
        while True:
            query = [("labelSelector", self.selector), ("limit", "500")]
            if token:
                query.append(("continue", token))
            page = await self._adapter._request("GET", self._adapter._path("pods"), query=query, what="pod list")
            for pod in page.get("items") or []:
                pods[pod["metadata"]["name"]] = pod
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            version = meta.get("resourceVersion") or version
            if not token:
                break
        for name in set(self.pods) - set(pods):
            if name in self.creating:
                self.gone.add(name)
        self.pods = pods
        self.lists += 1
        self.connected = True
        self.synced.set()
        self._notify_all()
        return version

    async def _watch(self, version: str) -> str:
        query = [
            ("labelSelector", self.selector),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", version),
            ("timeoutSeconds", str(WATCH_SECONDS)),
        ]
        # the connect is bounded by api_timeout; the stream by the server's timeout plus slack
        with anyio.fail_after(self._adapter.api_timeout):
            response = await self._adapter._open(
                "GET", self._adapter._path("pods"), query=query, timeout=WATCH_SECONDS + 60
            )
        self.watches += 1
        self.connected = True
        try:
            if response.status == 410:
                raise _Gone()
            if response.status >= 300:
                raise await _api_error(response)
            while True:
                line = await response.content.readline()
                if not line:
                    return version  # the server ended the watch: resume from here
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise ApiError(int(obj.get("code") or 500), obj.get("reason") or "", obj.get("message") or "")
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind == "BOOKMARK":
                    continue
                name = obj["metadata"]["name"]
                if kind == "DELETED":
                    self.pods.pop(name, None)
                    if name in self.creating:
                        self.gone.add(name)
                else:
                    self.pods[name] = obj
                self._notify(name)
        finally:
            response.release()


async def _api_error(response: aiohttp.ClientResponse) -> ApiError:
    try:
        body = await response.read()
        status = json.loads(body)
        reason, message = status.get("reason") or response.reason or "", status.get("message") or ""
    except Exception:  # noqa: BLE001 - not a Status object
        reason, message = response.reason or "", ""
    retry_after = None
    with contextlib.suppress(TypeError, ValueError):
        retry_after = float(response.headers.get("Retry-After", ""))
    return ApiError(response.status, reason, message, retry_after)


# -- the transport: how a shell in a pod is reached ------------------------------------------


class PodRef(msgspec.Struct, frozen=True):
    namespace: str
    name: str
    ip: str | None = None  # for transports that reach an agent in the pod directly


class Transport(Protocol):
    """How the adapter reaches a pod: a byte stream to a shell for the shell-session
    protocol, and one-shot commands (the timeout interrupt). The default is the API server's
    exec websocket; an agent in the pod reached over its IP is the intended alternative."""

    name: str

    async def start(self, configuration: k8s.Configuration) -> None: ...

    async def open_shell(self, pod: PodRef, command: list[str]) -> anyio.abc.ByteStream: ...

    # Optional: the stdout of a command, read on demand (the output relays). A transport
    # without it runs the shell protocol in spool mode (output in files in the pod).
    # async def open_output(self, pod: PodRef, command: list[str]) -> OutputStream: ...

    # Optional: stdin and stdout of a command, read on demand (Sandbox.open_stream). A
    # transport without it has no streams into its pods.
    # async def open_stream(self, pod: PodRef, command: list[str]) -> anyio.abc.ByteStream: ...

    async def run(self, pod: PodRef, command: list[str], timeout: float) -> tuple[int | None, bytes, bytes]: ...

    async def aclose(self) -> None: ...


class ExecStream(anyio.abc.ByteStream):
    """stdin/stdout of one exec websocket (channel protocol v4: a leading byte names the
    stream, 0 stdin, 1 stdout, 2 stderr, 3 status) as an anyio ByteStream for ShellClient.

    A reader task drains the websocket into an unbounded buffer as messages arrive, so a
    client busy writing a large frame can never deadlock against the shell's output; the
    buffer stays small because the client reads every frame to its end. stderr is not part
    of the protocol: its tail is kept to explain a shell that did not start.
    """

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self._ws = ws
        self._send, self._receive = anyio.create_memory_object_stream[bytes](max_buffer_size=math.inf)
        self._pending = b""
        self.stderr_tail = b""
        self.status = ""  # the exec's final status (channel 3), once it ended
        self._reader = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        try:
            async for message in self._ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    data = message.data
                elif message.type == aiohttp.WSMsgType.TEXT:
                    data = message.data.encode()
                else:
                    break
                if len(data) < 2:
                    continue  # the empty per-channel greeting
                channel, payload = data[0], data[1:]
                if channel == 1:
                    self._send.send_nowait(payload)
                elif channel == 2:
                    self.stderr_tail = (self.stderr_tail + payload)[-STDERR_KEPT:]
                elif channel == 3:
                    self.status = payload.decode(errors="replace")
        except Exception:  # noqa: BLE001 - any failure of the connection is the end of the stream
            pass
        finally:
            self._send.close()  # the client's next receive sees EndOfStream

    async def ended(self) -> None:
        """Until the exec's output has ended (its shell exited, or the websocket closed)."""
        await asyncio.wait({self._reader})  # never raises; cancelling it leaves the reader alone

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._pending:
            self._pending = await self._receive.receive()
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def send(self, item: bytes) -> None:
        if self._ws.closed:
            raise anyio.BrokenResourceError("the exec websocket is closed")
        try:
            with anyio.fail_after(SEND_TIMEOUT + len(item) / SEND_RATE):
                for start in range(0, len(item), SEND_CHUNK):
                    await self._ws.send_bytes(b"\x00" + item[start : start + SEND_CHUNK])
        except (TimeoutError, RuntimeError, OSError, aiohttp.ClientError) as exc:
            raise anyio.BrokenResourceError(f"the exec websocket is gone ({type(exc).__name__})") from exc

    async def send_eof(self) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._reader.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            with contextlib.suppress(Exception):
                await self._ws.close()
        self._receive.close()


class OutputStream(anyio.abc.ByteReceiveStream):
    """The stdout of one exec websocket without stdin (an output relay, see RELAY), read on
    demand: unread, the websocket's flow control holds the relay back. Any failure of the
    connection is the end of the stream."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self._ws = ws
        self._pending = b""
        self.stderr_tail = b""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._pending:
            try:
                message = await self._ws.receive()
            except Exception as exc:  # noqa: BLE001 - a broken connection ends the relay
                raise anyio.BrokenResourceError(f"the output relay is gone ({type(exc).__name__})") from exc
            if message.type == aiohttp.WSMsgType.BINARY:
                data = message.data
            elif message.type == aiohttp.WSMsgType.TEXT:
                data = message.data.encode()
            else:
                raise anyio.EndOfStream
            if len(data) < 2:
                continue  # the empty per-channel greeting
            if data[0] == 1:
                self._pending = data[1:]
            elif data[0] == 2:
                self.stderr_tail = (self.stderr_tail + data[1:])[-STDERR_KEPT:]
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def ready(self, name: str) -> None:
        """Wait for the relay's ready line; what follows it stays for the shell client."""
        line = f"@@RELAY {name}\n".encode()
        received = b""
        while not received.startswith(line):
            if len(received) >= len(line):
                raise anyio.BrokenResourceError(f"the output relay said {received[:80]!r}")
            received += await self.receive()
        self._pending = received[len(line) :] + self._pending

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            with contextlib.suppress(Exception):
                await self._ws.close()


class StreamSocket(OutputStream, anyio.abc.ByteStream):
    """stdin and stdout of one exec websocket (``open_stream``), read on demand like an
    output relay. The exec protocol here (v4) has no way to close stdin alone, so
    ``send_eof`` is not supported."""

    async def send(self, item: bytes) -> None:
        if self._ws.closed:
            raise anyio.BrokenResourceError("the exec websocket is closed")
        try:
            with anyio.fail_after(SEND_TIMEOUT + len(item) / SEND_RATE):
                for start in range(0, len(item), SEND_CHUNK):
                    await self._ws.send_bytes(b"\x00" + item[start : start + SEND_CHUNK])
        except (TimeoutError, RuntimeError, OSError, aiohttp.ClientError) as exc:
            raise anyio.BrokenResourceError(f"the exec websocket is gone ({type(exc).__name__})") from exc

    async def send_eof(self) -> None:
        raise NotImplementedError("the kubernetes exec protocol (v4) cannot close a process's stdin alone")


class ExecTransport:
    """The API server's exec websocket (kubernetes-asyncio ``WsApiClient``)."""

    name = "exec"

    def __init__(self, *, heartbeat: float | None = 30.0, connect_timeout: float = API_TIMEOUT):
        self.heartbeat = heartbeat
        self.connect_timeout = connect_timeout
        self._client: WsApiClient | None = None
        self._connector_session: aiohttp.ClientSession | None = None
        self._core: k8s.CoreV1Api | None = None

    async def start(self, configuration: k8s.Configuration) -> None:
        ws_config = _copy_configuration(configuration)
        # each live sandbox holds one connection: no pool limit (aiohttp: 0 = unlimited)
        ws_config.connection_pool_maxsize = 0
        self._client = WsApiClient(configuration=ws_config, heartbeat=self.heartbeat)
        # The client's aiohttp session carries aiohttp's default 5-minute total timeout; a
        # shell's websocket must live for the sandbox's whole TTL, so its session has none
        # (same connector). Liveness is the heartbeat's job: a ping every `heartbeat` s, and
        # a missing pong closes the stream (the sandbox then reads as lost).
        rest = self._client.rest_client
        self._connector_session = rest.pool_manager
        rest.pool_manager = aiohttp.ClientSession(
            connector=self._connector_session.connector,
            connector_owner=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
            trust_env=True,
        )
        self._core = k8s.CoreV1Api(self._client)

    async def _connect(self, pod: PodRef, command: list[str], stdin: bool) -> aiohttp.ClientWebSocketResponse:
        assert self._core is not None, "transport not started"
        try:
            with anyio.fail_after(self.connect_timeout):
                context = await self._core.connect_get_namespaced_pod_exec(
                    pod.name,
                    pod.namespace,
                    container=CONTAINER,
                    command=command,
                    stdin=stdin,
                    stdout=True,
                    stderr=True,
                    tty=False,
                    _preload_content=False,
                )
                return await context
        except aiohttp.WSServerHandshakeError as exc:
            raise CreateFailed(f"exec into pod {pod.name} refused: {exc.status} {exc.message}") from None
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            raise BackendUnavailable(f"exec into pod {pod.name} failed: {type(exc).__name__}: {exc}") from None

    async def open_shell(self, pod: PodRef, command: list[str]) -> anyio.abc.ByteStream:
        return ExecStream(await self._connect(pod, command, stdin=True))

    async def open_output(self, pod: PodRef, command: list[str]) -> OutputStream:
        return OutputStream(await self._connect(pod, command, stdin=False))

    async def open_stream(self, pod: PodRef, command: list[str]) -> StreamSocket:
        return StreamSocket(await self._connect(pod, command, stdin=True))

    async def run(self, pod: PodRef, command: list[str], timeout: float) -> tuple[int | None, bytes, bytes]:
        """A fresh exec websocket for one command: (exit code or None, stdout, stderr)."""
        out, err, status = bytearray(), bytearray(), ""
        with anyio.fail_after(timeout):
            ws = await self._connect(pod, command, stdin=False)
            try:
                async for message in ws:
                    if message.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                        break
                    data = message.data if isinstance(message.data, bytes) else message.data.encode()
                    if len(data) < 2:
                        continue
                    if data[0] == 1:
                        out += data[1:]
                    elif data[0] == 2:
                        err += data[1:]
                    elif data[0] == 3:
                        status = data[1:].decode(errors="replace")
            finally:
                await ws.close()
        return _exit_code(status), bytes(out), bytes(err)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._connector_session is not None:
            await self._connector_session.close()  # owns the connector
            self._connector_session = None


def _exit_code(status: str) -> int | None:
    """The exit code in an exec's final Status (channel 3); None when there is none."""
    if not status:
        return None
    try:
        parsed = json.loads(status)
    except ValueError:
        return None
    if parsed.get("status") == "Success":
        return 0
    for cause in (parsed.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            with contextlib.suppress(ValueError):
                return int(cause.get("message"))
    return None


def _copy_configuration(configuration: k8s.Configuration) -> k8s.Configuration:
    import copy

    return copy.copy(configuration)


# -- the shell client ------------------------------------------------------------------------


# -- the adapter ----------------------------------------------------------------------------


class KubernetesAdapter:
    """Sandboxes as pods. Options (``--adapter-options`` JSON in the CLI):

    image            default image when a spec names none (ORCHARD_K8S_IMAGE, else local/busybox:1)
    namespace        where the pods live (ORCHARD_K8S_NAMESPACE, else "orchard"); created if missing
    context          kubeconfig context (ORCHARD_K8S_CONTEXT, else the current context)
    kubeconfig       kubeconfig path(s) (else KUBECONFIG, else ~/.kube/config, else in-cluster)
    in_cluster       True: use the pod's service account even when a kubeconfig exists
    run_id, owner    lease labels (default: a fresh run id; user@host)
    node_selector    {label: value} for every pod
    tolerations      list of core/v1 Toleration dicts for every pod
    runtime_class    runtimeClassName (e.g. gvisor, kata) for stronger isolation
    priority_class   priorityClassName
    manage_network_policies  create the namespace's deny-egress policy and per-sandbox allow
                     policies (default True; False where an admin manages policies)
    read_only        read-only root file system; the workdir and the control dir get emptyDirs
    exit_with_shell  end the pod when its exec websocket closes (default True)
    max_creating     creates in flight at once (pod POST to shell answering)
    max_api          API calls in flight at once
    api_timeout      seconds one attempt of one API call may take
    api_retry_for    seconds one API call retries 429/5xx/connection errors (default 60)
    create_timeout   seconds from the pod POST to its shell answering
    attach_grace     seconds a pod waits for its shell before ending itself
    output_cap       bytes kept per output stream
    transport        a Transport (default ExecTransport(): the exec websocket)
    """

    name = "kubernetes"

    def __init__(
        self,
        *,
        image: str | None = None,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | None = None,
        in_cluster: bool = False,
        run_id: str | None = None,
        owner: str | None = None,
        node_selector: dict[str, str] | None = None,
        tolerations: list[dict[str, Any]] | None = None,
        runtime_class: str | None = None,
        priority_class: str | None = None,
        manage_network_policies: bool = True,
        read_only: bool = False,
        exit_with_shell: bool = True,
        max_creating: int = 32,
        max_api: int = 32,
        api_timeout: float = API_TIMEOUT,
        api_retry_for: float = API_RETRY_FOR,
        create_timeout: float = CREATE_TIMEOUT,
        attach_grace: float = ATTACH_GRACE,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        transport: Transport | None = None,
    ):
        if max_creating < 1 or max_api < 1:
            raise ConfigError("max_creating and max_api must be at least 1")
        if create_timeout <= 0 or api_timeout <= 0:
            raise ConfigError("create_timeout and api_timeout must be positive")
        self.image = image or os.environ.get("ORCHARD_K8S_IMAGE") or DEFAULT_IMAGE
        self.namespace = namespace or os.environ.get("ORCHARD_K8S_NAMESPACE") or DEFAULT_NAMESPACE
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", self.namespace):
            raise ConfigError(f"namespace {self.namespace!r} is not a valid Kubernetes namespace name")
        self.context = context or os.environ.get("ORCHARD_K8S_CONTEXT") or None
        self.kubeconfig = kubeconfig
        self.in_cluster = in_cluster
        self.run_id = label_value(run_id or uuid.uuid4().hex[:12])
        self.owner = owner or f"{os.environ.get('USER', 'user')}@{socket.gethostname()}"
        self.node_selector = dict(node_selector or {})
        self.tolerations = list(tolerations or [])
        self.runtime_class = runtime_class
        self.priority_class = priority_class
        self.manage_network_policies = manage_network_policies
        self.read_only = read_only
        self.exit_with_shell = exit_with_shell
        self.max_creating = max_creating
        self.max_api = max_api
        self.api_timeout = api_timeout
        self.api_retry_for = api_retry_for
        self.create_timeout = create_timeout
        self.attach_grace = attach_grace
        self.output_cap = output_cap
        self.transport: Transport = transport or ExecTransport()
        self.identity = controller_identity()
        self.controller = controller_label(self.identity)
        self.where = ""  # where the configuration came from, for messages
        # Event-loop objects are made on first use: the constructor may run outside a loop.
        self._configuration: k8s.Configuration | None = None
        self._api: k8s.ApiClient | None = None
        self._starting: anyio.Lock | None = None
        self._api_gate: anyio.Semaphore | None = None
        self._create_gate: anyio.Semaphore | None = None
        self._namespace_ready = False
        self.informer: PodInformer | None = None
        self._live: dict[str, ShellSandbox] = {}
        # answered once per image (and pull policy), not per create
        self._images_missing: dict[tuple[str, str], ImageMissing] = {}
        self._unremoved: dict[str, bool] = {}  # name -> had an allow policy; deletion not confirmed
        self._retrier: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()  # websockets being closed
        self.stats = {"api_calls": 0, "api_retries": 0}

    # -- configuration and API access -------------------------------------------------------

    def _config_source(self) -> str | None:
        """The kubeconfig path(s) to load, or None for the in-cluster service account
        (kubectl's order: KUBECONFIG, ~/.kube/config, in-cluster)."""
        path = self.kubeconfig or os.environ.get("KUBECONFIG") or ""
        default = Path.home() / ".kube" / "config"
        if self.in_cluster or (not path and not default.exists() and os.environ.get("KUBERNETES_SERVICE_HOST")):
            return None
        if not path:
            if not default.exists():
                raise AdapterUnavailable(
                    "no Kubernetes configuration: set KUBECONFIG, create ~/.kube/config, or run in a pod "
                    "(in-cluster config); for a local test cluster: scripts/ci-kubernetes.sh run -- CMD"
                )
            path = str(default)
        if not any(Path(p).expanduser().exists() for p in path.split(os.pathsep) if p):
            raise AdapterUnavailable(f"kubeconfig {path} does not exist")
        return path

    async def _load_configuration(self) -> k8s.Configuration:
        configuration = k8s.Configuration()
        path = self._config_source()
        try:
            if path is None:
                k8s_config.load_incluster_config(client_configuration=configuration)
                self.where = "in-cluster service account"
                return configuration
            await k8s_config.load_kube_config(
                config_file=path, context=self.context, client_configuration=configuration, persist_config=False
            )
        except k8s_config.ConfigException as exc:
            raise AdapterUnavailable(f"Kubernetes configuration unusable: {exc}") from None
        self.where = f"kubeconfig {path}" + (f", context {self.context}" if self.context else "")
        return configuration

    async def _start(self) -> None:
        """Configuration, API clients, gates and the pod watch: once, on first use."""
        if self._api is not None:
            return
        self._starting = self._starting or anyio.Lock()
        async with self._starting:
            if self._api is not None:
                return
            configuration = await self._load_configuration()
            configuration.connection_pool_maxsize = self.max_api + 4  # + the watch
            self._api_gate = anyio.Semaphore(self.max_api)
            self._create_gate = anyio.Semaphore(self.max_creating)
            await self.transport.start(configuration)
            self._configuration = configuration
            self._api = k8s.ApiClient(configuration)

    @property
    def server(self) -> str:
        return self._configuration.host if self._configuration else "?"

    def _path(self, resource: str, name: str = "", group: str = "") -> str:
        base = (
            f"/apis/{group}/namespaces/{self.namespace}/{resource}"
            if group
            else f"/api/v1/namespaces/{self.namespace}/{resource}"
        )
        return f"{base}/{name}" if name else base

    async def _open(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> aiohttp.ClientResponse:
        """One raw request (auth from the configuration); the caller reads and releases."""
        assert self._api is not None
        return await self._api.call_api(
            path,
            method,
            query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout or self.api_timeout,
        )

    async def _request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        retry_for: float | None = None,
    ) -> dict[str, Any]:
        """A JSON request under the API gate, each attempt under ``api_timeout``, retried with
        exponential backoff and jitter on 429 (after its Retry-After), 5xx and connection
        errors for up to ``retry_for`` seconds (``api_retry_for`` by default: an API server
        restart is survived). Raises ApiError for other answers, BackendUnavailable when
        the time runs out."""
        await self._start()
        assert self._api_gate is not None
        give_up = anyio.current_time() + (self.api_retry_for if retry_for is None else retry_for)
        delay = 0.1
        while True:
            wait = delay * (0.5 + random.random())
            try:
                async with self._api_gate:
                    self.stats["api_calls"] += 1
                    with anyio.fail_after(self.api_timeout):
                        response = await self._open(method, path, query=query, body=body)
                        try:
                            if response.status >= 300:
                                raise await _api_error(response)
                            data = await response.read()
                        finally:
                            response.release()
                return json.loads(data) if data else {}
            except ApiError as exc:
                if not _retryable(exc):
                    raise
                why = str(exc)
                if exc.retry_after:
                    wait = min(exc.retry_after, 30.0)
            except (TimeoutError, OSError, aiohttp.ClientError) as exc:
                why = f"cannot connect: {type(exc).__name__}: {exc}"
            if anyio.current_time() + wait > give_up:
                raise BackendUnavailable(f"Kubernetes API at {self.server} ({what}): {why}")
            self.stats["api_retries"] += 1
            await anyio.sleep(wait)
            delay = min(delay * 2, 5.0)

    async def _ensure_namespace(self) -> None:
        """The namespace, the deny-egress policy and the pod watch, once per adapter."""
        await self._start()
        if self._namespace_ready:
            return
        assert self._starting is not None
        async with self._starting:
            if self._namespace_ready:
                return
            if self.manage_network_policies:
                await self._create_deny_policy()
            if self.informer is None:
                self.informer = PodInformer(self, f"orchard.run={self.run_id},orchard.controller={self.controller}")
                self.informer.start()
            self._namespace_ready = True

    async def _create_deny_policy(self) -> None:
        path = self._path("networkpolicies", group="networking.k8s.io/v1")
        for _ in range(2):
            try:
                await self._request("POST", path, body=deny_egress_policy(), what="deny-egress NetworkPolicy")
                return
            except ApiError as exc:
                if exc.status == 409:
                    return  # created earlier (by us, another run, or an admin)
                if exc.status == 404 and "namespace" in exc.message:
                    await self._create_namespace()
                    continue
                if exc.status == 403:
                    raise ConfigError(
                        f"not allowed to create NetworkPolicies in namespace {self.namespace} ({exc.message}); "
                        "apply deploy/kubernetes/ (RBAC and the deny-egress policy) or pass manage_network_policies=false"
                    ) from None
                raise CreateFailed(f"could not create the deny-egress NetworkPolicy: {exc}") from None
        raise CreateFailed(f"namespace {self.namespace} vanished while it was being set up")

    async def _create_namespace(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.namespace, "labels": {"orchard.namespace": "true"}},
        }
        try:
            await self._request("POST", "/api/v1/namespaces", body=body, what="namespace create")
        except ApiError as exc:
            if exc.status == 409:
                return
            if exc.status == 403:
                raise ConfigError(
                    f"namespace {self.namespace} does not exist and this identity may not create it ({exc.message}); "
                    "apply deploy/kubernetes/namespace.yaml or choose an existing namespace"
                ) from None
            raise CreateFailed(f"could not create namespace {self.namespace}: {exc}") from None

    # -- create -----------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> Sandbox:
        image = spec.image or self.image
        if (image, spec.pull) in self._images_missing:
            raise self._images_missing[image, spec.pull]
        await self._ensure_namespace()
        assert self._create_gate is not None
        name = f"orchard-{uuid.uuid4().hex[:16]}"
        expires_at = time.time() + spec.ttl
        labels = self._labels(spec, expires_at, name)
        allow = spec.network == "on" and self.manage_network_policies
        informer = self.informer
        assert informer is not None
        async with self._create_gate:
            informer.creating.add(name)
            try:
                with anyio.CancelScope() as scope:
                    scope.deadline = anyio.current_time() + self.create_timeout
                    client, relays = await self._create(name, spec, image, labels, allow)
                if scope.cancelled_caught:
                    raise CreateFailed(await self._explain_timeout(name, image))
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._remove(name, allow)
                raise
            finally:
                informer.creating.discard(name)
                informer.gone.discard(name)

        async def teardown() -> None:
            self._live.pop(name, None)
            client.lost = client.lost or "the sandbox was closed"
            await self._remove(name, allow)
            # The websockets' close handshakes (up to seconds while the kubelet is busy
            # killing the pod) are not the caller's to wait for: they run in the background,
            # and close() waits for what is still running.
            for closing in (client.aclose(), self._close_streams(relays)):
                task = asyncio.get_running_loop().create_task(closing)
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

        pod = PodRef(self.namespace, name)
        sandbox = ShellSandbox(
            id=name,
            client=client,
            root="/",
            labels=labels,
            on_close=teardown,
            expires_at=expires_at,
            stream_opener=lambda sandbox, command: self._open_stream(pod, sandbox, command),
        )
        self._live[name] = sandbox
        return sandbox

    async def _create(
        self, name: str, spec: SandboxSpec, image: str, labels: dict[str, str], allow: bool
    ) -> tuple[CgroupShellClient, list[Any]]:
        manifest = self._pod_manifest(name, spec, image, labels)
        try:
            pod = await self._request("POST", self._path("pods"), body=manifest, what="pod create")
        except ApiError as exc:
            if exc.status == 409:
                pod = {}  # a retried POST whose first attempt went through
            elif exc.status in (400, 403, 422):  # refused as asked: retrying cannot help
                raise ConfigError(f"the cluster refused the sandbox pod: {exc.message}") from None
            else:
                raise CreateFailed(f"pod create failed: {exc}") from None
        if allow:
            uid = (pod.get("metadata") or {}).get("uid")
            try:
                await self._request(
                    "POST",
                    self._path("networkpolicies", group="networking.k8s.io/v1"),
                    body=allow_egress_policy(name, uid),
                    what="allow-egress NetworkPolicy",
                )
            except ApiError as exc:
                if exc.status != 409:
                    raise CreateFailed(f"could not create the allow-egress NetworkPolicy for {name}: {exc}") from None
        await self._wait_running(name, image, spec.pull)
        return await self._open_shell(name, spec)

    def _labels(self, spec: SandboxSpec, expires_at: float, name: str) -> dict[str, str]:
        return {
            **spec.labels,
            "orchard.owner": label_value(self.owner),
            "orchard.run": self.run_id,
            "orchard.expires": str(int(expires_at)),
            CONTROLLER_LABEL: self.controller,
            "orchard.sandbox": name,
        }

    def _pod_manifest(self, name: str, spec: SandboxSpec, image: str, labels: dict[str, str]) -> dict[str, Any]:
        ttl = max(1, math.ceil(spec.ttl))
        grace = min(ttl, math.ceil(self.attach_grace))
        pull = {"missing": "IfNotPresent", "never": "Never", "always": "Always"}[spec.pull]
        if pull == "IfNotPresent" and build_command(image, self.name):
            pull = "Never"  # built here by `orchard-async images build`: no registry has it
        container: dict[str, Any] = {
            "name": CONTAINER,
            "image": image,
            "imagePullPolicy": pull,
            "command": ["sh", "-c", TIMER, "orchard-timer", str(grace), str(ttl - grace), SHELL_PID],
            "env": [{"name": key, "value": value} for key, value in spec.env.items()],
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "privileged": False,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        quantities: dict[str, str] = {}
        if spec.cpu:
            quantities["cpu"] = f"{math.ceil(spec.cpu * 1000)}m"
        if spec.memory_bytes:
            quantities["memory"] = str(spec.memory_bytes)
        if quantities:  # requests = limits: what the scheduler reserves is what the pod may use
            container["resources"] = {"requests": quantities, "limits": dict(quantities)}
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": ttl,
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "shareProcessNamespace": True,
            "containers": [container],
        }
        if self.read_only:
            container["securityContext"]["readOnlyRootFilesystem"] = True
            workdir = spec.workdir or DEFAULT_WORKDIR
            container["volumeMounts"] = [{"name": "work", "mountPath": workdir}, {"name": "ctl", "mountPath": CTL_DIR}]
            pod_spec["volumes"] = [{"name": "work", "emptyDir": {}}, {"name": "ctl", "emptyDir": {}}]
        if self.node_selector:
            pod_spec["nodeSelector"] = self.node_selector
        if self.tolerations:
            pod_spec["tolerations"] = self.tolerations
        if self.runtime_class:
            pod_spec["runtimeClassName"] = self.runtime_class
        if self.priority_class:
            pod_spec["priorityClassName"] = self.priority_class
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {"orchard/controller": json.dumps(self.identity), "orchard/owner": self.owner},
            },
            "spec": pod_spec,
        }

    async def _wait_running(self, name: str, image: str, pull: str = "missing") -> None:
        """Until the watch sees the pod Running; a fatal state fails at once."""
        informer = self.informer
        assert informer is not None
        while True:
            changed = informer.changed(name)
            pod = informer.pods.get(name)
            if pod is not None:
                verdict, why = pod_verdict(pod)
                if verdict == "ready":
                    return
                if verdict == "failed" and why.startswith(IMAGE_ABSENT):
                    missing = ImageMissing(
                        f"image {image} is not on the cluster's node ({why.split(':')[0]}); "
                        f"{missing_image_hint(image, 'the node', self.name)}"
                    )
                    self._images_missing[image, pull] = missing
                    raise missing
                if verdict == "failed":
                    raise CreateFailed(await self._failure_message(name, image, why))
            elif name in informer.gone and informer.synced.is_set():
                raise CreateFailed(f"pod {name} was deleted while it was being created")
            await changed.wait()

    async def _failure_message(self, name: str, image: str, why: str) -> str:
        event = await self._last_warning(name)
        hint = f"; {IMAGE_HINT}" if any(word in why for word in ("Image", "image")) else ""
        extra = f"; last event: {event}" if event and event not in why else ""
        return f"sandbox pod {name} (image {image}) failed to start: {why}{extra}{hint}"

    async def _explain_timeout(self, name: str, image: str) -> str:
        with anyio.CancelScope(shield=True):
            informer = self.informer
            pod = informer.pods.get(name) if informer else None
            why = pod_verdict(pod)[1] if pod else "the pod watch has not seen it"
            if informer is not None and not informer.connected:
                why += f" (the pod watch is reconnecting: {informer.last_error})"
            event = await self._last_warning(name)
        extra = f"; last event: {event}" if event and event not in why else ""
        return f"sandbox pod {name} (image {image}) was not ready within {self.create_timeout:.0f}s: {why}{extra}"

    async def _last_warning(self, name: str) -> str:
        """The newest Warning event about the pod, if the API answers quickly."""
        query = [("fieldSelector", f"involvedObject.name={name},type=Warning")]
        try:
            with anyio.fail_after(5):
                events = await self._request("GET", self._path("events"), query=query, what="events", retry_for=0)
        except (OrchardError, ApiError, TimeoutError):
            return ""
        items = sorted(events.get("items") or [], key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        if not items:
            return ""
        return f"{items[-1].get('reason')}: {items[-1].get('message')}"

    async def _open_relays(self, pod: PodRef) -> tuple[Any, Any] | None:
        """The two output relays (stdout, stderr; see RELAY), opened at once and each ready;
        None when the transport has none (spool mode). Their websockets go with the pod."""
        opener = getattr(self.transport, "open_output", None)
        if opener is None:
            return None
        relays: dict[str, Any] = {}
        errors: list[Exception] = []

        async def open_relay(fifo: str) -> None:
            try:
                relay = await opener(pod, ["sh", "-c", RELAY, "orchard-relay", OUT_DIR, fifo])
            except (CreateFailed, BackendUnavailable) as exc:
                errors.append(exc)
                return
            relays[fifo] = relay
            try:
                with anyio.fail_after(READY_TIMEOUT):
                    await relay.ready(fifo)
            except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
                why = relay.stderr_tail.decode(errors="replace").strip()
                if why:  # it could not make its FIFO: the image's doing, not the cluster's
                    errors.append(
                        ConfigError(
                            f"the sandbox could not create its output FIFO in {OUT_DIR}: {why}; "
                            "the image's user must be able to write /tmp (read_only=True mounts an emptyDir there)"
                        )
                    )
                else:
                    errors.append(
                        CreateFailed(f"the output relay of pod {pod.name} did not start ({type(exc).__name__})")
                    )

        # errors are collected, not raised, so that they do not leave the task group wrapped
        # in an exception group
        try:
            async with anyio.create_task_group() as group:
                for fifo in ("o", "e"):
                    group.start_soon(open_relay, fifo)
            if errors:
                raise errors[0]
        except BaseException:
            await self._close_streams(list(relays.values()))
            raise
        return relays["o"], relays["e"]

    async def _close_streams(self, streams: list[Any]) -> None:
        with anyio.CancelScope(shield=True):
            for stream in streams:
                await stream.aclose()

    async def _open_shell(self, name: str, spec: SandboxSpec) -> tuple[CgroupShellClient, list[Any]]:
        """The long-lived shell exec, its output relays, and the shell-session server; the
        client and the relay streams (the caller closes them with the pod)."""
        seen = self.informer.pods.get(name, {}) if self.informer else {}
        pod = PodRef(self.namespace, name, (seen.get("status") or {}).get("podIP"))
        command = SHELL_ENDS_POD if self.exit_with_shell else SHELL_ONLY
        stream = await self.transport.open_shell(pod, command)
        workdir = spec.workdir or DEFAULT_WORKDIR
        relays: tuple[Any, Any] | None = None
        try:
            await stream.send(_preamble(workdir).encode())
            try:
                relays = await self._open_relays(pod)
            except (ConfigError, CreateFailed):
                # A shell whose preamble failed ends the pod's processes, relays and all:
                # its reason is the one to give.
                ended = getattr(stream, "ended", None)
                if ended is not None:
                    with anyio.move_on_after(5):
                        await ended()
                if SETUP_FAILED not in getattr(stream, "stderr_tail", b"").decode(errors="replace"):
                    raise
                raise SandboxLost("the sandbox shell did not start") from None
            client = CgroupShellClient(
                stream,
                workdir=workdir,
                interrupt=lambda shell: self._interrupt(pod, shell),
                output_cap=self.output_cap,
                output_pipes=OUT_DIR if relays else None,
                output_relays=relays,
            )
            await client.start(CTL_DIR)
        except (SandboxLost, anyio.BrokenResourceError) as exc:
            await stream.aclose()
            await self._close_streams(list(relays or ()))
            why = getattr(stream, "stderr_tail", b"").decode(errors="replace")
            if SETUP_FAILED in why:
                raise ConfigError(
                    f"the sandbox could not create {workdir} and {CTL_DIR}: {why.replace(SETUP_FAILED, '').strip()}; "
                    "choose a workdir the image's user can write (read_only=True mounts an emptyDir there)"
                ) from None
            raise CreateFailed(f"the sandbox shell in pod {name} did not start: {why.strip() or exc}") from None
        except BaseException:
            await stream.aclose()
            await self._close_streams(list(relays or ()))
            raise
        return client, list(relays or ())

    async def _open_stream(self, pod: PodRef, sandbox: Sandbox, command: list[str]) -> anyio.abc.ByteStream:
        """One exec websocket with stdin: ``open_stream``'s transport."""
        opener = getattr(self.transport, "open_stream", None)
        if opener is None:
            raise ConfigError(f"the kubernetes transport {self.transport.name!r} cannot open streams into pods")
        try:
            return await opener(pod, command)
        except CreateFailed as exc:  # the pod is gone, or the API server refused the exec
            raise SandboxLost(f"no stream into {sandbox.id}: {exc}") from None

    async def _interrupt(self, pod: PodRef, client: ShellClient) -> None:
        """The client's timeout: SIGUSR1 to the server shell, by a second short exec. If it
        cannot be delivered in time, the client's grace period declares the sandbox lost."""
        with contextlib.suppress(Exception):
            await self.transport.run(pod, ["sh", "-c", f"kill -USR1 {int(client.server_pid)}"], INTERRUPT_TIMEOUT)

    # -- destroy, reap, close ----------------------------------------------------------------

    async def destroy(self, sandbox: Sandbox) -> None:
        await sandbox.close()

    async def _remove(self, name: str, allow: bool) -> bool:
        """Delete a pod (grace 0, background propagation: one API call, the kubelet stops the
        containers after) and its allow policy; never raises. What the API did not confirm
        is retried in the background and by ``close`` (and the pod ends at its TTL anyway)."""
        with anyio.CancelScope(shield=True):
            try:
                await self._delete(self._path("pods", name), f"pod {name} delete")
                if allow:
                    await self._delete(
                        self._path("networkpolicies", f"{name}-egress", group="networking.k8s.io/v1"),
                        f"policy {name}-egress delete",
                    )
            except (OrchardError, ApiError):
                self._unremoved[name] = allow
                self._retry_deletions()
                return False
        self._unremoved.pop(name, None)
        return True

    def _retry_deletions(self) -> None:
        """Keep retrying unconfirmed deletions in the background (an API server restart
        must not leave pods behind), until they succeed or ``close`` takes over."""
        if self._retrier is not None and not self._retrier.done():
            return

        async def retry() -> None:
            delay = 1.0
            while self._unremoved:
                await asyncio.sleep(delay)
                for name, allow in list(self._unremoved.items()):
                    await self._remove_quietly(name, allow)
                delay = min(delay * 2, 15.0)

        self._retrier = asyncio.get_running_loop().create_task(retry())

    async def _remove_quietly(self, name: str, allow: bool) -> None:
        try:
            await self._delete(self._path("pods", name), f"pod {name} delete")
            if allow:
                await self._delete(
                    self._path("networkpolicies", f"{name}-egress", group="networking.k8s.io/v1"),
                    f"policy {name}-egress delete",
                )
        except (OrchardError, ApiError):
            return
        self._unremoved.pop(name, None)

    async def _delete(self, path: str, what: str) -> None:
        query = [("gracePeriodSeconds", "0"), ("propagationPolicy", "Background")]
        try:
            await self._request("DELETE", path, query=query, what=what, retry_for=DELETE_RETRY_FOR)
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def list_owned(self) -> list[str]:
        """Live sandboxes, and destroyed ones whose deletion the API did not confirm."""
        return sorted(set(self._live) | set(self._unremoved))

    async def _list_all(self, path: str, selector: str, what: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            query = [("labelSelector", selector), ("limit", "500")]
            if token:
                query.append(("continue", token))
            page = await self._request("GET", path, query=query, what=what)
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    async def reap(self, older_than: float = 0.0) -> list[str]:
        """Delete orchard pods in the namespace (anyone's) whose TTL passed ``older_than``
        seconds ago, that ended, or whose controller is dead; and allow policies whose pod is
        gone. Lists first, completely: a failed list raises before anything is deleted."""
        await self._start()
        policy_path = self._path("networkpolicies", group="networking.k8s.io/v1")
        # policies before pods: a policy is created after its pod, so one whose pod is
        # missing from the later pod list belongs to a pod that is really gone
        policies = (
            await self._list_all(policy_path, "orchard.sandbox", "policy list") if self.manage_network_policies else []
        )
        pods = await self._list_all(self._path("pods"), "orchard.owner,orchard.expires", "pod list for reap")
        now = time.time()
        doomed = [
            pod["metadata"]["name"]
            for pod in pods
            if pod["metadata"]["name"] not in self._live
            and not pod["metadata"].get("deletionTimestamp")
            and _is_abandoned(pod, now, older_than)
        ]
        names = {pod["metadata"]["name"] for pod in pods}
        orphans = [
            policy["metadata"]["name"]
            for policy in policies
            if policy["metadata"].get("labels", {}).get("orchard.sandbox") not in names
        ]
        removed: list[str] = []

        async def remove_pod(name: str) -> None:
            with contextlib.suppress(OrchardError, ApiError):
                await self._delete(self._path("pods", name), f"pod {name} delete")
                removed.append(name)

        async def remove_policy(name: str) -> None:
            with contextlib.suppress(OrchardError, ApiError):
                await self._delete(f"{policy_path}/{name}", f"policy {name} delete")

        async with anyio.create_task_group() as group:
            for name in doomed:
                group.start_soon(remove_pod, name)
            for name in orphans:
                group.start_soon(remove_policy, name)
        return sorted(removed)

    async def close(self) -> None:
        """Destroy every live sandbox, retry unconfirmed deletions, stop the watch."""
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as group:
                for sandbox in list(self._live.values()):
                    group.start_soon(sandbox.close)
            if self._retrier is not None:
                self._retrier.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._retrier
                self._retrier = None
            if self._unremoved and self._api is not None:
                async with anyio.create_task_group() as group:
                    for name, allow in list(self._unremoved.items()):
                        group.start_soon(self._remove_quietly, name, allow)
            if self._closing:
                await asyncio.gather(*self._closing, return_exceptions=True)
            if self.informer is not None:
                await self.informer.stop()
                self.informer = None
            self._namespace_ready = False
            await self.transport.aclose()
            if self._api is not None:
                await self._api.close()
                self._api = None

    async def doctor(self) -> str:
        """One line for `orchard-async doctor`; raises AdapterUnavailable when there is no
        configuration or the API server does not answer."""
        configuration = await self._load_configuration()
        api = k8s.ApiClient(configuration)
        try:
            with anyio.fail_after(10):
                response = await api.call_api(
                    "/version",
                    "GET",
                    header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _request_timeout=10,
                )
                try:
                    if response.status >= 300:
                        raise await _api_error(response)
                    version = json.loads(await response.read())
                finally:
                    response.release()
        except (TimeoutError, OSError, aiohttp.ClientError, ApiError) as exc:
            raise AdapterUnavailable(
                f"cannot reach the Kubernetes API at {configuration.host} ({self.where}): {type(exc).__name__}: {exc}"
            ) from None
        finally:
            await api.close()
        return (
            f"Kubernetes {version.get('gitVersion', '?')} at {configuration.host} ({self.where}); "
            f"namespace {self.namespace}; default image {self.image}; transport {self.transport.name}; "
            "each sandbox: all capabilities dropped, no privilege escalation, RuntimeDefault seccomp, "
            f"egress {'denied by NetworkPolicy unless spec.network=' + repr('on') if self.manage_network_policies else 'left to the cluster admin'}; "
            "spec.pids NOT enforced per sandbox (only the kubelet's node-wide --pod-max-pids caps a pod)"
        )


def _preamble(workdir: str) -> str:
    """What the exec's shell runs before the server script (it then becomes the server): the
    directories it and the commands need, and its pid for the timer (see TIMER)."""
    dirs = f"{quote(CTL_DIR)} {quote(workdir)}"
    return f"mkdir -p -- {dirs} && echo $$ >{quote(SHELL_PID)} || {{ echo {SETUP_FAILED} >&2; exit 1; }}\n"


def deny_egress_policy() -> dict[str, Any]:
    """Namespace-wide, every sandbox pod (label ``orchard.sandbox``) may send nothing.
    NetworkPolicies add up: a sandbox that asks for network gets its own allow policy. Pods
    without the label (a controller running in the same namespace) are not affected."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": DENY_POLICY, "labels": {"orchard.policy": "deny-egress"}},
        "spec": {
            "podSelector": {"matchExpressions": [{"key": "orchard.sandbox", "operator": "Exists"}]},
            "policyTypes": ["Egress"],
            "egress": [],
        },
    }


def allow_egress_policy(name: str, uid: str | None) -> dict[str, Any]:
    """All egress for one sandbox pod, owned by it (the garbage collector deletes it with
    the pod; the adapter deletes it too, and reap removes orphans)."""
    metadata: dict[str, Any] = {
        "name": f"{name}-egress",
        "labels": {"orchard.sandbox": name, "orchard.policy": "allow-egress"},
    }
    if uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {"podSelector": {"matchLabels": {"orchard.sandbox": name}}, "policyTypes": ["Egress"], "egress": [{}]},
    }


def _is_abandoned(pod: dict[str, Any], now: float, older_than: float) -> bool:
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return True  # ended (TTL, deadline, its shell's websocket closed): of no use to anyone
    labels = pod["metadata"].get("labels") or {}
    try:
        expires = float(labels.get("orchard.expires", "0"))
    except ValueError:
        expires = 0.0
    if expires + older_than < now:
        return True
    return controller_alive((pod["metadata"].get("annotations") or {}).get("orchard/controller")) is False


__all__ = [
    "ExecTransport",
    "KubernetesAdapter",
    "PodInformer",
    "PodRef",
    "Transport",
    "allow_egress_policy",
    "controller_alive",
    "deny_egress_policy",
    "label_value",
    "pod_verdict",
]

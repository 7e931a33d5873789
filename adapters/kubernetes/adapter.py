"""The kubernetes adapter: sandboxes as pods, created through ``api``, watched by ``watch``,
reached through a ``transport``, described by ``manifests``, driven by the core's container
shell (orchard_async.container_shell). See the package's docstring for the whole picture."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import time
import uuid
from typing import Any

import anyio

from orchard_async import labels as names
from orchard_async.container_shell import (
    DEFAULT_WORKDIR,
    SHELL_ONLY,
    OutputStream,
    close_streams,
    is_abandoned,
    shell_command,
    start_shell,
)
from orchard_async.errors import ConfigError, CreateFailed, OrchardError, SandboxLost
from orchard_async.images import ImageMissing, missing_image_hint
from orchard_async.protocols import Sandbox
from orchard_async.sandbox import ShellSandbox
from orchard_async.shell import CgroupShellClient, ShellClient
from orchard_async.types import DEFAULT_OUTPUT_CAP, SandboxSpec

from .api import API_RETRY_FOR, API_TIMEOUT, NETWORKING, ApiError, KubeApi
from .manifests import (
    PodSettings,
    allow_egress_policy,
    allow_policy_name,
    deny_egress_policy,
    namespace_manifest,
    pod_manifest,
    sandbox_labels,
)
from .transport import ExecTransport, PodRef, Transport
from .watch import PodInformer, pod_verdict

DEFAULT_NAMESPACE = "orchard"
DEFAULT_IMAGE = "local/busybox:1"
CREATE_TIMEOUT = 180.0  # pod POST to shell answering
ATTACH_GRACE = 120.0  # the timer's wait for a shell before the pod ends itself
INTERRUPT_TIMEOUT = 10.0
IMAGE_HINT = (
    "check the image name; on a cluster without a registry import it into the node's runtime "
    "(`orchard-async images build --adapter kubernetes` on a one-node cluster)"
)
# waiting reasons that say the image is not there and will not be: the user's to fix
IMAGE_ABSENT = ("ErrImageNeverPull", "InvalidImageName")


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
        self.run_id = names.label_value(run_id or uuid.uuid4().hex[:12])
        self.owner = owner or f"{os.environ.get('USER', 'user')}@{socket.gethostname()}"
        self.pod_settings = PodSettings(
            attach_grace=attach_grace,
            read_only=read_only,
            node_selector=dict(node_selector or {}),
            tolerations=list(tolerations or []),
            runtime_class=runtime_class,
            priority_class=priority_class,
        )
        self.manage_network_policies = manage_network_policies
        self.exit_with_shell = exit_with_shell
        self.max_creating = max_creating
        self.create_timeout = create_timeout
        self.output_cap = output_cap
        self.api = KubeApi(
            namespace=self.namespace,
            context=context or os.environ.get("ORCHARD_K8S_CONTEXT") or None,
            kubeconfig=kubeconfig,
            in_cluster=in_cluster,
            max_api=max_api,
            api_timeout=api_timeout,
            api_retry_for=api_retry_for,
        )
        self.transport: Transport = transport or ExecTransport()
        self.identity = names.controller_identity()
        self.controller = names.controller_label(self.identity)
        # Event-loop objects are made on first use: the constructor may run outside a loop.
        self._started = False
        self._starting: anyio.Lock | None = None
        self._create_gate: anyio.Semaphore | None = None
        self._namespace_ready = False
        self.informer: PodInformer | None = None
        self._live: dict[str, ShellSandbox] = {}
        # answered once per image (and pull policy), not per create
        self._images_missing: dict[tuple[str, str], ImageMissing] = {}
        self._unremoved: dict[str, bool] = {}  # name -> had an allow policy; deletion not confirmed
        self._retrier: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()  # websockets being closed

    @property
    def stats(self) -> dict[str, int]:
        return self.api.stats

    @property
    def server(self) -> str:
        return self.api.server

    async def _start(self) -> None:
        """The API client, the create gate and the transport: once, on first use."""
        if self._started:
            return
        self._starting = self._starting or anyio.Lock()
        async with self._starting:
            if self._started:
                return
            configuration = await self.api.start()
            self._create_gate = anyio.Semaphore(self.max_creating)
            await self.transport.start(configuration)
            self._started = True

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
                selector = f"{names.RUN}={self.run_id},{names.CONTROLLER}={self.controller}"
                self.informer = PodInformer(self.api, selector)
                self.informer.start()
            self._namespace_ready = True

    async def _create_deny_policy(self) -> None:
        path = self.api.path("networkpolicies", group=NETWORKING)
        for _ in range(2):
            try:
                await self.api.request("POST", path, body=deny_egress_policy(), what="deny-egress NetworkPolicy")
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
        body = namespace_manifest(self.namespace)
        try:
            await self.api.request("POST", "/api/v1/namespaces", body=body, what="namespace create")
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
            for closing in (client.aclose(), close_streams(relays)):
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
    ) -> tuple[CgroupShellClient, list[OutputStream]]:
        manifest = self._pod_manifest(name, spec, image, labels)
        try:
            pod = await self.api.request("POST", self.api.path("pods"), body=manifest, what="pod create")
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
                await self.api.request(
                    "POST",
                    self.api.path("networkpolicies", group=NETWORKING),
                    body=allow_egress_policy(name, uid),
                    what="allow-egress NetworkPolicy",
                )
            except ApiError as exc:
                if exc.status != 409:
                    raise CreateFailed(f"could not create the allow-egress NetworkPolicy for {name}: {exc}") from None
        await self._wait_running(name, image, spec.pull)
        return await self._open_shell(name, spec)

    def _labels(self, spec: SandboxSpec, expires_at: float, name: str) -> dict[str, str]:
        return sandbox_labels(
            spec, name=name, owner=self.owner, run=self.run_id, expires_at=expires_at, controller=self.controller
        )

    def _pod_manifest(self, name: str, spec: SandboxSpec, image: str, labels: dict[str, str]) -> dict[str, Any]:
        return pod_manifest(name, spec, image, labels, self.pod_settings, identity=self.identity, owner=self.owner)

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
                events = await self.api.request("GET", self.api.path("events"), query=query, what="events", retry_for=0)
        except (OrchardError, ApiError, TimeoutError):
            return ""
        items = sorted(events.get("items") or [], key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        if not items:
            return ""
        return f"{items[-1].get('reason')}: {items[-1].get('message')}"

    async def _open_shell(self, name: str, spec: SandboxSpec) -> tuple[CgroupShellClient, list[OutputStream]]:
        """The long-lived shell exec, its output relays (when the transport has them), and
        the shell-session server; the client and the relays (closed with the pod)."""
        seen = self.informer.pods.get(name, {}) if self.informer else {}
        pod = PodRef(self.namespace, name, (seen.get("status") or {}).get("podIP"))
        command = shell_command() if self.exit_with_shell else SHELL_ONLY
        stream = await self.transport.open_shell(pod, command)
        opener = getattr(self.transport, "open_output", None)
        return await start_shell(
            stream,
            workdir=spec.workdir or DEFAULT_WORKDIR,
            open_output=(lambda command: opener(pod, command)) if opener else None,
            interrupt=lambda shell: self._interrupt(pod, shell),
            output_cap=self.output_cap,
            mount="an emptyDir",
            where=f" in pod {name}",
        )

    async def _open_stream(self, pod: PodRef, sandbox: Sandbox, command: list[str]) -> Any:
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

    async def _delete_sandbox(self, name: str, allow: bool) -> None:
        """The pod and its allow policy; raises what the API raised."""
        await self.api.delete(self.api.path("pods", name), f"pod {name} delete")
        if allow:
            policy = allow_policy_name(name)
            await self.api.delete(self.api.path("networkpolicies", policy, group=NETWORKING), f"policy {policy} delete")

    async def _remove(self, name: str, allow: bool) -> bool:
        """Delete a pod and its allow policy; never raises. What the API did not confirm is
        retried in the background and by ``close`` (and the pod ends at its TTL anyway)."""
        with anyio.CancelScope(shield=True):
            try:
                await self._delete_sandbox(name, allow)
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
            await self._delete_sandbox(name, allow)
        except (OrchardError, ApiError):
            return
        self._unremoved.pop(name, None)

    async def list_owned(self) -> list[str]:
        """Live sandboxes, and destroyed ones whose deletion the API did not confirm."""
        return sorted(set(self._live) | set(self._unremoved))

    async def reap(self, older_than: float = 0.0) -> list[str]:
        """Delete orchard pods in the namespace (anyone's) whose TTL passed ``older_than``
        seconds ago, that ended, or whose controller is dead; and allow policies whose pod is
        gone. Lists first, completely: a failed list raises before anything is deleted."""
        await self._start()
        policy_path = self.api.path("networkpolicies", group=NETWORKING)
        # policies before pods: a policy is created after its pod, so one whose pod is
        # missing from the later pod list belongs to a pod that is really gone
        policies = (
            await self.api.list_all(policy_path, names.SANDBOX, "policy list") if self.manage_network_policies else []
        )
        pods = await self.api.list_all(self.api.path("pods"), f"{names.OWNER},{names.EXPIRES}", "pod list for reap")
        now = time.time()
        doomed = [
            pod["metadata"]["name"]
            for pod in pods
            if pod["metadata"]["name"] not in self._live
            and not pod["metadata"].get("deletionTimestamp")
            and _pod_abandoned(pod, now, older_than)
        ]
        present = {pod["metadata"]["name"] for pod in pods}
        orphans = [
            policy["metadata"]["name"]
            for policy in policies
            if policy["metadata"].get("labels", {}).get(names.SANDBOX) not in present
        ]
        removed: list[str] = []

        async def remove_pod(name: str) -> None:
            try:
                await self.api.delete(self.api.path("pods", name), f"pod {name} delete")
            except (OrchardError, ApiError):
                return  # the next reap tries again
            removed.append(name)

        async def remove_policy(name: str) -> None:
            try:
                await self.api.delete(f"{policy_path}/{name}", f"policy {name} delete")
            except (OrchardError, ApiError):
                return

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
            if self._unremoved and self.api.started:
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
            await self.api.close()
            self._started = False

    async def doctor(self) -> str:
        """One line for `orchard-async doctor`; raises AdapterUnavailable when there is no
        configuration or the API server does not answer."""
        version = await self.api.version()
        egress = (
            "denied by NetworkPolicy unless spec.network='on'"
            if self.manage_network_policies
            else "left to the cluster admin"
        )
        return (
            f"Kubernetes {version.get('gitVersion', '?')} at {version['host']} ({self.api.where}); "
            f"namespace {self.namespace}; default image {self.image}; transport {self.transport.name}; "
            "each sandbox: all capabilities dropped, no privilege escalation, RuntimeDefault seccomp, "
            f"egress {egress}; "
            "spec.pids NOT enforced per sandbox (only the kubelet's node-wide --pod-max-pids caps a pod)"
        )


def _pod_abandoned(pod: dict[str, Any], now: float, older_than: float) -> bool:
    metadata = pod["metadata"]
    # ended (TTL, deadline, its shell's websocket closed): of no use to anyone
    ended = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
    alive = names.annotated_controller_alive((metadata.get("annotations") or {}).get(names.CONTROLLER_ANNOTATION))
    return is_abandoned(
        metadata.get("labels") or {}, ended=ended, controller_alive=alive, now=now, older_than=older_than
    )

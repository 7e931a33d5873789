"""The kubernetes adapter: sandboxes as pods, created through ``api``, watched by ``watch``,
reached through a ``transport``, described by ``manifests``, driven by the core's container
shell (orchard_async.kit.container_shell). See the package's docstring for the whole picture."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import socket
import subprocess
import time
import uuid
from typing import Any

import anyio
import msgspec

from orchard_async.adapters.kubernetes import guardian
from orchard_async.adapters.kubernetes import snapshot as snaps
from orchard_async.adapters.kubernetes.api import NETWORKING, ApiError, KubeApi
from orchard_async.adapters.kubernetes.attach import adoptable
from orchard_async.adapters.kubernetes.config import KubernetesConfig
from orchard_async.adapters.kubernetes.egress import EGRESS_CONTAINER, apply_command, gateway, node_has_image
from orchard_async.adapters.kubernetes.forks import Forks
from orchard_async.adapters.kubernetes.hollow import (
    CONTROL_PLANE_LABEL,
    HOLLOW_LABEL,
    ControlPlaneSandbox,
    hollow_manifest,
    hollow_placement,
    hollow_verdict,
)
from orchard_async.adapters.kubernetes.manifests import (
    DEADLINE_ANNOTATION,
    GPU_RESOURCE,
    PodSettings,
    allow_egress_policy,
    allow_policy_name,
    deny_egress_policy,
    egress_rules,
    gpus_of,
    namespace_manifest,
    pod_manifest,
    relay_ingress_policy,
    sandbox_labels,
)
from orchard_async.adapters.kubernetes.podip import PodIpTransport
from orchard_async.adapters.kubernetes.reap import reap
from orchard_async.adapters.kubernetes.relay import new_secret
from orchard_async.adapters.kubernetes.transport import ExecTransport, Outputs, PodRef, PodRelays, Streams, Transport
from orchard_async.adapters.kubernetes.watch import EGRESS_FAILED, PodInformer, pod_state, pod_verdict
from orchard_async.capabilities import (
    OFFLINE,
    AdapterFacts,
    Doctor,
    Facts,
    NetworkConflict,
    NetworkPolicy,
    Reattach,
    Snapshots,
    spec_network,
)
from orchard_async.errors import BackendUnavailable, ConfigError, CreateFailed, OrchardError, SandboxLost
from orchard_async.images import ImageMissing, missing_image_hint
from orchard_async.kit import container_reattach, container_shell
from orchard_async.kit import labels as names
from orchard_async.kit.background import Background, BackgroundOwner
from orchard_async.kit.deadline import explained_deadline
from orchard_async.kit.egress import NetworkSwitch
from orchard_async.kit.exec_streams import OutputStream, close_streams
from orchard_async.kit.guardian import stop_guardian
from orchard_async.kit.retry import Backoff
from orchard_async.kit.sandbox import ShellSandbox
from orchard_async.kit.shell import CgroupShellClient, ShellClient
from orchard_async.protocols import Sandbox
from orchard_async.types import SandboxSpec

DEFAULT_NAMESPACE = "orchard"
DEFAULT_IMAGE = "local/busybox:1"
INTERRUPT_TIMEOUT = 10.0
FILTER_TIMEOUT = 30.0  # one switch of a pod's egress filter (an exec into its sidecar)
DELETION_BACKOFF = Backoff(1.0, cap=15.0)  # between background sweeps of unconfirmed deletions
IMAGE_HINT = (
    "check the image name; on a cluster without a registry import it into the node's runtime "
    "(`orchard-async images build --adapter kubernetes` on a one-node cluster)"
)
# waiting reasons that say the image is not there and will not be: the user's to fix
IMAGE_ABSENT = ("ErrImageNeverPull", "InvalidImageName")


class KubernetesAdapter(BackgroundOwner):
    """Sandboxes as pods, configured by a KubernetesConfig (or its fields by keyword);
    ``transport`` reaches the pods (default ExecTransport(): the exec websocket). Hold it as
    ``async with KubernetesAdapter(...) as adapter:`` (or ``close()`` it): the pod watch,
    deletion retries, exec readers and websocket close handshakes run in its task group
    (orchard_async.kit.background)."""

    name = "kubernetes"
    capabilities = frozenset({Snapshots, Reattach, Doctor, Facts})

    def __init__(self, config: KubernetesConfig | None = None, *, transport: Transport | None = None, **options: Any):
        try:
            config = config or msgspec.convert(options, KubernetesConfig)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"bad option for the kubernetes adapter: {exc}") from None
        self.config = config
        self.image = config.image or os.environ.get("ORCHARD_K8S_IMAGE") or DEFAULT_IMAGE
        self.namespace = config.namespace or os.environ.get("ORCHARD_K8S_NAMESPACE") or DEFAULT_NAMESPACE
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", self.namespace):
            raise ConfigError(f"namespace {self.namespace!r} is not a valid Kubernetes namespace name")
        self.run_id = names.label_value(config.run_id or uuid.uuid4().hex[:12])
        self.owner = config.owner or f"{os.environ.get('USER', 'user')}@{socket.gethostname()}"
        node_selector, tolerations = config.node_selector, config.tolerations
        if config.control_plane_only:
            node_selector, tolerations = hollow_placement(node_selector, tolerations)
        self.pod_settings = PodSettings(
            attach_grace=config.attach_grace,
            reattach_grace=config.reattach_grace if config.exit_with_shell else 0.0,
            read_only=config.read_only,
            node_selector=node_selector,
            tolerations=tolerations,
            runtime_class=config.runtime_class,
            priority_class=config.priority_class,
            gpu_runtime_class=config.gpu_runtime_class,
        )
        self.api = KubeApi(
            namespace=self.namespace,
            context=config.context or os.environ.get("ORCHARD_K8S_CONTEXT") or None,
            kubeconfig=config.kubeconfig,
            in_cluster=config.in_cluster,
            max_api=config.max_api,
            api_timeout=config.api_timeout,
            api_retry_for=config.api_retry_for,
            api_qps=config.api_qps,
            api_burst=config.api_burst,
        )
        if transport is None and config.pod_ip and not config.control_plane_only:
            transport = PodIpTransport(ExecTransport(), relay_port=config.relay_port)
        self.transport: Transport = transport or ExecTransport()
        # the transport reaches a relay in each pod (podip): the pods get one, with a secret
        self.relay_port = self.transport.relay_port if isinstance(self.transport, PodRelays) else None
        self.identity = names.controller_identity()
        self.controller = names.controller_label(self.identity)
        # Event-loop objects are made on first use: the constructor may run outside a loop.
        self._started = False
        self._starting: anyio.Lock | None = None
        self._create_gate: anyio.Semaphore | None = None
        self._namespace_ready = False
        self.informer: PodInformer | None = None
        self._live: dict[str, ShellSandbox | ControlPlaneSandbox] = {}
        # answered once per image (and pull policy), not per create
        self._images_missing: dict[tuple[str, str], ImageMissing] = {}
        self._unremoved: dict[str, bool] = {}  # name -> had an allow policy; deletion not confirmed
        self._background = Background()
        self._retrying: anyio.Event | None = None  # set when the deletion retrier has stopped
        self.forks = Forks(config)
        self.snapshot_dir = self.forks.store
        self._pod_images: dict[str, str] = {}  # live sandbox -> its image (its forks' default)
        # deletes this adapter's pods if the process dies (guardian.py)
        self._guardian: subprocess.Popen[bytes] | None = None
        self._guarded = False
        # the pods' egress filter (egress.py): decided with the namespace ("auto" asks the nodes)
        self.egress_filter = "off" if config.control_plane_only else config.egress_filter
        self.egress_note = "" if self.egress_filter != "auto" else "not decided yet: no sandbox made"

    @property
    def facts(self) -> AdapterFacts:
        return AdapterFacts(image=self.image, max_creating=self.config.max_creating)

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
            self._create_gate = anyio.Semaphore(self.config.max_creating)
            await self.transport.start(configuration, self._background)
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
            if self.config.manage_network_policies:
                await self._create_deny_policy()
            if self.egress_filter == "auto":
                await self._decide_egress_filter()
            if self.egress_filter == "on" and not self.pod_settings.egress_image:
                self.pod_settings = msgspec.structs.replace(self.pod_settings, egress_image=self.config.egress_image)
            if self.informer is None:
                selector = f"{names.RUN}={self.run_id},{names.CONTROLLER}={self.controller}"
                self.informer = PodInformer(self.api, selector)
                self._background.start_soon(self.informer.run)
            self._namespace_ready = True

    async def _decide_egress_filter(self) -> None:
        """For egress_filter="auto": the filter in every pod when a node of the cluster has its
        image (loaded there, or pulled from a registry it was pushed to); else NetworkPolicies only."""
        image = self.config.egress_image
        try:
            nodes = await self.api.request("GET", "/api/v1/nodes", what="nodes")
        except ApiError as exc:
            if exc.status not in (401, 403):
                raise CreateFailed(f"could not list the nodes to find the egress filter's image: {exc}") from None
            self.egress_filter = "off"
            self.egress_note = f"this identity may not list nodes to find {image} (pass egress_filter='on')"
            return
        if any(node_has_image(node, image) for node in nodes.get("items", [])):
            self.egress_filter, self.egress_note = "on", ""
        else:
            self.egress_filter = "off"
            self.egress_note = (
                f"no node has {image} (`orchard-async images build {image} --adapter kubernetes` on a one-node "
                "cluster, or a registry; then egress_filter='on')"
            )

    async def _create_deny_policy(self) -> None:
        await self._create_namespace_policy(deny_egress_policy(), "deny-egress")
        if self.relay_port:
            await self._create_namespace_policy(relay_ingress_policy(), "relay-ingress")

    async def _create_namespace_policy(self, policy: dict[str, Any], kind: str) -> None:
        path = self.api.path("networkpolicies", group=NETWORKING)
        for _ in range(2):
            try:
                await self.api.request("POST", path, body=policy, what=f"{kind} NetworkPolicy")
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
                raise CreateFailed(f"could not create the {kind} NetworkPolicy: {exc}") from None
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

    async def create(self, spec: SandboxSpec) -> ShellSandbox | ControlPlaneSandbox:
        # The create timeout is the caller's (the pool's, see pool.py), counted from here:
        # give up a little before it, so that the error says why the pod is not ready
        # (unschedulable, an image still pulling, the watch reconnecting), not only that
        # time ran out.
        deadline, budget = explained_deadline()
        archive, lease = snaps.source(self.snapshot_dir, spec.snapshot) if spec.snapshot else (None, {})
        image = spec.image or lease.get("image") or self.image
        if lease.get("fork_image"):  # an image in the node's containerd: no registry has it
            image, spec = lease["fork_image"], msgspec.structs.replace(spec, pull="never")
        if (image, spec.pull) in self._images_missing:
            raise self._images_missing[image, spec.pull]
        await self._ensure_namespace()
        if not self._guarded:
            self._guarded = True
            config = msgspec.structs.replace(self.config, namespace=self.namespace, run_id=self.run_id)
            selector = f"{names.RUN}={self.run_id},{names.CONTROLLER}={self.controller}"
            self._guardian = guardian.start(config, selector, self.pod_settings.reattach_grace)
        if spec.gpus:
            await self._check_gpus(spec.gpus)
        assert self._create_gate is not None
        name = f"orchard-{uuid.uuid4().hex[:16]}"
        expires_at = time.time() + spec.ttl
        labels = self._labels(spec, expires_at, name)
        allow = spec.network == "on" and self.config.manage_network_policies
        informer = self.informer
        assert informer is not None
        async with self._create_gate:
            informer.creating.add(name)
            try:
                with anyio.CancelScope(deadline=deadline) as scope:
                    shell = await self._create(name, spec, image, labels, allow, lease.get("node"))
                if scope.cancelled_caught:
                    raise CreateFailed(await self._explain_timeout(name, image, budget))
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._remove(name, allow)
                raise
            finally:
                informer.creating.discard(name)
                informer.gone.discard(name)
        if shell is None:  # control-plane-only: the pod is Running; there is no shell
            return self._control_plane_sandbox(name, labels, expires_at, allow)
        client, relays = shell
        filtered = bool(self.pod_settings.egress_image)
        sandbox = self._sandbox(
            name, client, relays, labels, expires_at, allow, spec_network(spec.network), filtered, spec.max_extension
        )
        self._pod_images[name] = image
        if archive is not None:
            try:
                with anyio.CancelScope(deadline=deadline) as scope:
                    await snaps.restore(sandbox, archive)
                if scope.cancelled_caught:
                    raise CreateFailed(f"the fork {name} was not filled from {spec.snapshot} within {budget:.3g}s")
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await sandbox.close()
                raise
        return sandbox

    def _sandbox(
        self,
        name: str,
        client: CgroupShellClient,
        relays: list[OutputStream],
        labels: dict[str, str],
        expires_at: float,
        allow: bool,
        network: NetworkPolicy,
        filtered: bool,
        max_extension: float = 0.0,
    ) -> ShellSandbox:
        """``filtered``: the pod has the egress filter's sidecar (egress.py); ``max_extension``:
        its TTL may be extended that far (its pod has the deadline volume: manifests.TIMER)."""
        policy_made = [allow]  # set_network may make the pod's own policy later

        async def teardown() -> None:
            self._live.pop(name, None)
            self._pod_images.pop(name, None)
            client.lost = client.lost or "the sandbox was closed"
            await self._remove(name, policy_made[0])
            if isinstance(self.transport, PodRelays):
                self.transport.forget(PodRef(self.namespace, name))
            # The websockets' close handshakes (up to seconds while the kubelet is busy
            # killing the pod) are not the caller's to wait for: they run in the background,
            # and close() waits for them (they end by themselves: CLOSE_TIMEOUT bounds each).
            self._background.start_soon(client.close, cancel_on_close=False)
            self._background.start_soon(close_streams, relays, cancel_on_close=False)

        async def enforce(policy: NetworkPolicy) -> str | None:
            # The filter first: the NetworkPolicy, where a CNI enforces it, never opens what
            # the filter does not yet allow.
            host = await self._switch_filter(name, client, policy, policy_made) if filtered else None
            if self.config.manage_network_policies:
                await self._set_egress_policy(name, policy)
                policy_made[0] = True
            return host

        refusal = (
            ""
            if self.config.manage_network_policies or filtered
            else "with manage_network_policies=false and no egress filter in its pod (egress_filter) the adapter "
            "cannot switch a sandbox's network"
        )

        async def extend(until: float) -> None:
            # The annotation is the deadline the pod's timer re-reads (projected read-only into
            # it); the label is what reap reads.
            patch = {
                "metadata": {
                    "annotations": {DEADLINE_ANNOTATION: str(math.ceil(until))},
                    "labels": {names.EXPIRES: str(int(until))},
                }
            }
            try:
                await self.api.request(
                    "PATCH",
                    self.api.path("pods", name),
                    what=f"pod {name} deadline",
                    body=patch,
                    content_type="application/merge-patch+json",
                )
            except ApiError as exc:
                if exc.status == 404:
                    raise SandboxLost(f"sandbox {name} is gone: its pod no longer exists") from None
                raise BackendUnavailable(f"could not extend pod {name}'s deadline: {exc}") from None
            labels[names.EXPIRES] = str(int(until))

        opener = functools.partial(self._open_stream, PodRef(self.namespace, name))
        sandbox = self._live[name] = container_shell.container_sandbox(
            name,
            client,
            labels,
            expires_at,
            teardown=teardown,
            open_stream=opener,
            network=NetworkSwitch(network, enforce, refusal=refusal),
            ttl_extender=extend,
            max_extension=max_extension,
            ttl_refusal=""
            if max_extension
            else "it was created with max_extension=0 (SandboxSpec.max_extension), "
            "or taken over from another controller",
        )
        return sandbox

    async def _switch_filter(
        self, name: str, client: CgroupShellClient, policy: NetworkPolicy, policy_made: list[bool]
    ) -> str | None:
        """Replace the pod's egress filter with ``policy``'s, by an exec into its sidecar; the
        pod's gateway (the node as the pod reaches it). If that fails, whatever the reason
        (the sidecar killed from inside the sandbox, an exec that did not answer), the filter
        is in an unknown state: the sandbox is ended (its pod deleted) and SandboxLost says why."""
        if client.lost:
            raise SandboxLost(f"sandbox {name} is lost ({client.lost}): its network cannot be switched")
        transport = self.transport.fallback if isinstance(self.transport, PodIpTransport) else self.transport
        why = ""
        if not isinstance(transport, ExecTransport):
            why = f"the transport {self.transport.name!r} cannot exec into the filter's container"
        else:
            try:
                code, out, err = await transport.run(
                    PodRef(self.namespace, name), apply_command(policy), FILTER_TIMEOUT, container=EGRESS_CONTAINER
                )
                if code == 0:
                    return gateway(out.decode(errors="replace"))
                said = (err or out).decode(errors="replace").strip().splitlines()
                why = f"the filter in the {EGRESS_CONTAINER} container failed: {(said or [f'exit code {code}'])[-1][:300]}"
            except TimeoutError:
                why = f"the {EGRESS_CONTAINER} container did not answer within {FILTER_TIMEOUT:.0f}s"
            except (CreateFailed, OrchardError) as exc:
                why = f"no exec into the {EGRESS_CONTAINER} container (killed from inside the sandbox?): {exc}"
        client.lost = f"its egress filter could not be switched ({why}); the sandbox was ended"
        await self._remove(name, policy_made[0])
        raise SandboxLost(f"sandbox {name}: {client.lost}")

    async def _set_egress_policy(self, name: str, policy: NetworkPolicy) -> None:
        """Rewrite the pod's own NetworkPolicy to ``policy`` (made, owned by the pod, if it has
        none). The update carries the resourceVersion read, so a concurrent writer's change
        is never overwritten: it is a NetworkConflict."""
        collection = self.api.path("networkpolicies", group=NETWORKING)
        path = self.api.path("networkpolicies", allow_policy_name(name), group=NETWORKING)
        what = f"egress NetworkPolicy of {name}"
        try:
            try:
                current = await self.api.request("GET", path, what=what)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                pod = await self.api.request("GET", self.api.path("pods", name), what=f"pod {name} read")
                uid = (pod.get("metadata") or {}).get("uid")
                await self.api.request("POST", collection, body=allow_egress_policy(name, uid, policy), what=what)
                return
            current.setdefault("spec", {})["egress"] = egress_rules(policy)
            current["spec"]["policyTypes"] = ["Egress"]
            await self.api.request("PUT", path, body=current, what=what)
        except ApiError as exc:
            if exc.status == 409:
                raise NetworkConflict(f"the {what} changed meanwhile: {exc.message}") from None
            if exc.status == 404:
                raise SandboxLost(f"sandbox {name} is gone: its network cannot be switched") from None
            raise ConfigError(f"could not set the {what}: {exc}") from None

    async def _create(
        self, name: str, spec: SandboxSpec, image: str, labels: dict[str, str], allow: bool, node: str | None = None
    ) -> tuple[CgroupShellClient, list[OutputStream]] | None:
        secret = new_secret() if self.relay_port else None
        manifest = self._pod_manifest(name, spec, image, labels, secret)
        if node:  # a fork of a containerd snapshot: its image is on that node only
            manifest["spec"]["nodeName"] = node
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
        if self.config.control_plane_only:
            return None
        seen = self.informer.pods.get(name) if self.informer else None
        pod = PodRef(self.namespace, name, seen.pod_ip if seen else None, secret, image)
        return await self._open_shell(
            pod, spec.workdir or container_shell.DEFAULT_WORKDIR, writable_dirs=spec.writable_dirs
        )

    def _control_plane_sandbox(
        self, name: str, labels: dict[str, str], expires_at: float, allow: bool
    ) -> ControlPlaneSandbox:
        async def teardown() -> None:
            self._live.pop(name, None)
            await self._remove(name, allow)

        sandbox = self._live[name] = ControlPlaneSandbox(name, labels, expires_at, teardown)
        return sandbox

    def _labels(self, spec: SandboxSpec, expires_at: float, name: str) -> dict[str, str]:
        return sandbox_labels(
            spec,
            name=name,
            owner=self.owner,
            run=self.run_id,
            expires_at=expires_at,
            controller=self.controller,
            reattach_grace=self.pod_settings.reattach_grace,
        )

    def _pod_manifest(
        self, name: str, spec: SandboxSpec, image: str, labels: dict[str, str], secret: str | None = None
    ) -> dict[str, Any]:
        relay = (self.relay_port, secret) if self.relay_port and secret else None
        manifest = pod_manifest(
            name, spec, image, labels, self.pod_settings, identity=self.identity, owner=self.owner, relay=relay
        )
        return hollow_manifest(manifest) if self.config.control_plane_only else manifest

    async def _wait_running(self, name: str, image: str, pull: str = "missing") -> None:
        """Until the watch sees the pod Running; a fatal state fails at once."""
        informer = self.informer
        assert informer is not None
        while True:
            changed = informer.changed(name)
            pod = informer.pods.get(name)
            if pod is not None:
                verdict, why = (hollow_verdict if self.config.control_plane_only else pod_verdict)(pod)
                if verdict == "ready":
                    return
                if verdict == "failed" and why.startswith(EGRESS_FAILED):
                    event = await self.api.last_warning(name)
                    why += f"; last event: {event}" if event and event not in why else ""
                    raise ConfigError(
                        f"sandbox pod {name}: {why} (image {self.pod_settings.egress_image}); "
                        f"{missing_image_hint(self.pod_settings.egress_image or '', 'the node', self.name)}, "
                        "or pass egress_filter='off' (NetworkPolicies only)"
                    )
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
        event = await self.api.last_warning(name)
        hint = f"; {IMAGE_HINT}" if any(word in why for word in ("Image", "image")) else ""
        extra = f"; last event: {event}" if event and event not in why else ""
        return f"sandbox pod {name} (image {image}) failed to start: {why}{extra}{hint}"

    async def _explain_timeout(self, name: str, image: str, budget: float) -> str:
        with anyio.CancelScope(shield=True):
            informer = self.informer
            pod = informer.pods.get(name) if informer else None
            why = pod_verdict(pod)[1] if pod else "the pod watch has not seen it"
            if informer is not None and not informer.connected:
                why += f" (the pod watch is reconnecting: {informer.last_error})"
            event = await self.api.last_warning(name)
        extra = f"; last event: {event}" if event and event not in why else ""
        return f"sandbox pod {name} (image {image}) was not ready within {budget:.3g}s: {why}{extra}"

    async def _check_gpus(self, wanted: int) -> None:
        """Refuse a spec asking for more GPUs than any node offers (the pod would wait
        unschedulable until its create timed out). Where this key may not list nodes, the
        scheduler is left to decide."""
        try:
            nodes = await self.api.request("GET", "/api/v1/nodes", what="nodes", retry_for=0)
        except ApiError as exc:
            if exc.status in (401, 403):
                return
            raise
        most = max((gpus_of(node) for node in nodes.get("items", [])), default=0)
        if most < wanted:
            raise ConfigError(
                f"gpus={wanted}, but no node of the cluster offers that many {GPU_RESOURCE} "
                f"(at most {most}); install NVIDIA's device plugin on a GPU node, or ask for fewer"
            )

    async def _open_shell(
        self, pod: PodRef, workdir: str, *, writable_dirs: tuple[str, ...] = ()
    ) -> tuple[CgroupShellClient, list[OutputStream]]:
        """The long-lived shell exec, its output relays (when the transport has them), and
        the shell-session server; the client and the relays (closed with the pod)."""
        name = pod.name
        grace = self.pod_settings.reattach_grace
        if not self.config.exit_with_shell:
            command = container_shell.SHELL_ONLY
        elif grace:
            command = container_reattach.shell_command(0.0, grace)
        else:
            command = container_shell.shell_command()
        stream = await self.transport.open_shell(pod, command)
        transport = self.transport
        return await container_shell.start_shell(
            stream,
            workdir=workdir,
            open_output=(lambda command: transport.open_output(pod, command))
            if isinstance(transport, Outputs)
            else None,
            interrupt=lambda shell: self._interrupt(pod, shell),
            output_cap=self.config.output_cap,
            mount="an emptyDir",
            writable_dirs=writable_dirs,
            where=f" in pod {name}",
        )

    async def _open_stream(self, pod: PodRef, sandbox: Sandbox, command: list[str]) -> Any:
        """One exec websocket with stdin: ``open_stream``'s transport."""
        if not isinstance(self.transport, Streams):
            raise ConfigError(f"the kubernetes transport {self.transport.name!r} cannot open streams into pods")
        try:
            return await self.transport.open_stream(pod, command)
        except CreateFailed as exc:  # the pod is gone, or the API server refused the exec
            raise SandboxLost(f"no stream into {sandbox.id}: {exc}") from None

    async def _interrupt(self, pod: PodRef, client: ShellClient) -> None:
        """The client's timeout: SIGUSR1 to the server shell, by a second short exec. If it
        cannot be delivered in time, the client's grace period declares the sandbox lost."""
        with contextlib.suppress(Exception):
            await self.transport.run(pod, ["sh", "-c", f"kill -USR1 {int(client.server_pid)}"], INTERRUPT_TIMEOUT)

    # -- forks (snapshot.py) -------------------------------------------------------------------

    async def snapshot(self, sandbox: Sandbox) -> str:
        """Freeze ``sandbox`` (not its processes) into a snapshot: its file system as an image
        in its node's containerd, else its work dir as a tar the controller keeps (snapshot.py);
        ``create`` with ``spec.snapshot`` starts from it."""
        live = self._live.get(sandbox.id)
        if live is None or not isinstance(live, ShellSandbox):
            raise ConfigError(f"sandbox {sandbox.id} is not a live sandbox of this adapter with a shell")
        image = self._pod_images.get(sandbox.id, self.image)
        pod = self.informer.pods.get(sandbox.id) if self.informer else None
        if pod is None or "://" not in (pod.container_id or ""):
            pod = pod_state(
                await self.api.request("GET", self.api.path("pods", sandbox.id), what="pod get for snapshot")
            )
        # cancellable (a stalled stream must not hang the caller): cut short, take removes its dir
        return await self.forks.take(live, pod, dict(live.labels), self.identity, image)

    async def drop_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot (idempotent); forks already made keep what they got."""
        await self.forks.drop(snapshot_id)

    # -- destroy, reap, close ----------------------------------------------------------------

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
        if self._retrying is not None and not self._retrying.is_set():
            return
        stopped = self._retrying = anyio.Event()

        async def retry() -> None:
            sweeps = 0
            try:
                while self._unremoved:
                    await anyio.sleep(DELETION_BACKOFF.delay(sweeps))
                    for name, allow in list(self._unremoved.items()):
                        await self._remove_quietly(name, allow)
                    sweeps += 1
            finally:
                stopped.set()

        self._background.start_soon(retry)

    async def _remove_quietly(self, name: str, allow: bool) -> None:
        try:
            await self._delete_sandbox(name, allow)
        except (OrchardError, ApiError):
            return
        self._unremoved.pop(name, None)

    async def attach(self, sandbox_id: str) -> ShellSandbox | ControlPlaneSandbox:
        """A new shell session on a live pod another controller made with a reattach grace (and
        that controller gone): SandboxLost when it ended or expired (deleted then), or was made
        without one; CreateFailed while another controller's session is alive (attach.py)."""
        if sandbox_id in self._live:
            return self._live[sandbox_id]
        await self._start()
        allow = self.config.manage_network_policies  # its allow policy, if any, goes with it
        found = await adoptable(self.api, self.transport, sandbox_id, remove=lambda name: self._remove(name, allow))
        client, relays = await self._open_shell(found.pod, found.workdir)
        # As a gone controller left it is not known: the first change rewrites the pod's policy whole.
        return self._sandbox(sandbox_id, client, relays, found.labels, found.expires_at, allow, OFFLINE, found.filtered)

    async def find_sandboxes(self, labels: dict[str, str]) -> dict[str, dict[str, str]]:
        """Sandbox pods (anyone's, live or ended but not yet deleted) carrying every one of
        ``labels``: pod name -> its labels."""
        await self._start()
        selector = ",".join([names.OWNER, *(f"{key}={value}" for key, value in labels.items())])
        pods = await self.api.list_all(self.api.path("pods"), selector, "pod list for attach")
        return {pod["metadata"]["name"]: pod["metadata"].get("labels") or {} for pod in pods}

    async def list_owned(self) -> list[str]:
        """Live sandboxes, and destroyed ones whose deletion the API did not confirm."""
        return sorted(set(self._live) | set(self._unremoved))

    async def reap(self, older_than: float = 0.0) -> list[str]:
        """Delete orchard pods in the namespace (anyone's) whose TTL passed ``older_than``
        seconds ago, that ended, or whose controller is dead; allow policies whose pod is gone;
        snapshots of dead runs (reap.py)."""
        await self._start()
        pods = await reap(self.api, older_than, keep=set(self._live), policies=self.config.manage_network_policies)
        # after the pods: a fork's container holds its snapshot's layer
        return sorted(pods + await self.forks.reap(older_than))

    async def close(self) -> None:
        """Destroy every live sandbox, drop this run's snapshots, retry unconfirmed
        deletions, stop the watch."""
        with anyio.CancelScope(shield=True):
            await container_shell.concurrently(*(sandbox.close for sandbox in list(self._live.values())))
            for snapshot_id in list(self.forks.taken):
                await self.drop_snapshot(snapshot_id)
            # the watch and the retrier are cancelled, the close handshakes waited for
            await self._background.close()
            if self._unremoved and self.api.started:
                await container_shell.concurrently(
                    *(functools.partial(self._remove_quietly, name, allow) for name, allow in self._unremoved.items())
                )
            self.informer = None
            self._namespace_ready = False
            await self.transport.close()
            await self.api.close()
            self._started = False
            if self._guardian is not None:
                await anyio.to_thread.run_sync(stop_guardian, self._guardian)
                self._guardian, self._guarded = None, False

    def _egress_doctor(self) -> str:
        """Which enforcement holds a sandbox's network, plainly."""
        policies = (
            "NetworkPolicies (the namespace's deny, the pod's own allow, rewritten by set_network; "
            "enforced only by a CNI with NetworkPolicy support)"
            if self.config.manage_network_policies
            else "no NetworkPolicies of the adapter's (left to the cluster admin)"
        )
        if self.egress_filter == "on":
            return (
                f"held by a packet filter in each pod's network namespace (image {self.config.egress_image}: a "
                "CAP_NET_ADMIN-only container installs it before the sandbox's starts, and set_network execs "
                f"iptables-restore into it; whatever the CNI), and by {policies}"
            )
        note = f"; {self.egress_note}" if self.egress_note else ""
        return f"held ONLY by {policies}: no packet filter in the pods (egress_filter={self.egress_filter}{note})"

    async def doctor(self) -> str:
        """One line for `orchard-async doctor`; raises AdapterUnavailable when there is no
        configuration or the API server does not answer."""
        version = await self.api.version()
        if self.egress_filter == "auto":
            with contextlib.suppress(OrchardError):
                await self._start()
                await self._decide_egress_filter()
        egress = self._egress_doctor()
        if self.config.control_plane_only:
            return (
                f"Kubernetes {version.get('gitVersion', '?')} at {version['host']} ({self.api.where}); "
                f"namespace {self.namespace}; {CONTROL_PLANE_LABEL}: pods on nodes labelled {HOLLOW_LABEL}=true"
            )
        return (
            f"Kubernetes {version.get('gitVersion', '?')} at {version['host']} ({self.api.where}); "
            f"namespace {self.namespace}; default image {self.image}; transport {self.transport.name}; "
            "each sandbox: all capabilities dropped, no privilege escalation, RuntimeDefault seccomp, "
            f"egress {egress}; "
            "spec.pids NOT enforced per sandbox (only the kubelet's node-wide --pod-max-pids caps a pod); "
            f"{await self.forks.describe()}"
        )

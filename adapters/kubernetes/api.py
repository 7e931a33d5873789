"""The Kubernetes API as the adapter uses it: configuration, and JSON requests under one
gate (``max_api`` at once), each attempt under a timeout, retried with exponential backoff
and jitter on 429 (honouring Retry-After), 5xx and connection errors; paginated lists.

Config: ``kubeconfig=`` or ``KUBECONFIG`` or ``~/.kube/config`` (``context=`` selects a
context), else the in-cluster service account: kubectl's order.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from orchard_async.errors import AdapterUnavailable, BackendUnavailable, OrchardError
from orchard_async.kit.retry import Attempts, Backoff, retry_after

API_TIMEOUT = 30.0  # one attempt of one API call
API_RETRY_FOR = 60.0  # how long one call retries 429/5xx/connection errors
DELETE_RETRY_FOR = 10.0  # shorter for deletes: the caller waits; close() and reap retry later
API_BACKOFF = Backoff(0.1, cap=5.0, jitter=(0.5, 1.5))  # between retries of one call
MAX_RETRY_AFTER = 30.0  # the longest Retry-After honoured
NETWORKING = "networking.k8s.io/v1"  # the API group of NetworkPolicies


class ApiError(Exception):
    """A non-2xx answer of the API server, with its Status object's reason and message."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


def retryable(exc: ApiError) -> bool:
    if exc.status == 429 or exc.status >= 500:
        return True
    # A namespace the adapter just created has no default ServiceAccount for a moment.
    return exc.status == 403 and "serviceaccount" in exc.message.replace(" ", "").lower() and "not found" in exc.message


async def api_error(response: aiohttp.ClientResponse) -> ApiError:
    """The ApiError a non-2xx response stands for (its body read, if it is a Status)."""
    try:
        body = await response.read()
        status = json.loads(body)
        reason, message = status.get("reason") or response.reason or "", status.get("message") or ""
    except Exception:  # noqa: BLE001 - not a Status object
        reason, message = response.reason or "", ""
    return ApiError(response.status, reason, message, retry_after(response.headers.get("Retry-After")))


class RateLimit:
    """client-go's QPS and burst: a token bucket of ``burst`` tokens refilled at ``qps`` a
    second; each request takes one, waiting when the bucket is empty. Bounds the request
    rate the way ``max_api`` bounds the requests in flight (a large cluster's API server
    has priority-and-fairness limits per client; a small one has only its CPU)."""

    def __init__(self, qps: float, burst: int | None = None):
        self.qps = qps
        self.burst = burst or max(1, int(qps))
        self._tokens = float(self.burst)
        self._at: float | None = None

    async def take(self) -> None:
        now = anyio.current_time()
        if self._at is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now
        self._tokens -= 1.0  # reserved now: later callers queue behind this one
        if self._tokens < 0:
            await anyio.sleep(-self._tokens / self.qps)


class KubeApi:
    """One namespace's API: requests under the gate with retries, lists, deletes. The
    client is made on first use (the constructor may run outside an event loop)."""

    def __init__(
        self,
        *,
        namespace: str,
        context: str | None = None,
        kubeconfig: str | None = None,
        in_cluster: bool = False,
        max_api: int = 32,
        api_timeout: float = API_TIMEOUT,
        api_retry_for: float = API_RETRY_FOR,
        api_qps: float | None = None,
        api_burst: int | None = None,
    ):
        self.namespace = namespace
        self.context = context
        self.kubeconfig = kubeconfig
        self.in_cluster = in_cluster
        self.max_api = max_api
        self.api_timeout = api_timeout
        self.api_retry_for = api_retry_for
        self.where = ""  # where the configuration came from, for messages
        self.configuration: k8s.Configuration | None = None
        # api_calls and api_retries, and one "api_<VERB>" count per HTTP method (every attempt)
        self.stats: dict[str, int] = {"api_calls": 0, "api_retries": 0}
        self._rate = RateLimit(api_qps, api_burst) if api_qps else None
        self._client: k8s.ApiClient | None = None
        self._starting: anyio.Lock | None = None
        self._gate: anyio.Semaphore | None = None

    # -- configuration ---------------------------------------------------------------------

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

    async def load_configuration(self) -> k8s.Configuration:
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

    async def start(self) -> k8s.Configuration:
        """The configuration, the gate and the client: once, on first use."""
        if self.configuration is not None:
            return self.configuration
        self._starting = self._starting or anyio.Lock()
        async with self._starting:
            if self.configuration is None:
                configuration = await self.load_configuration()
                configuration.connection_pool_maxsize = self.max_api + 4  # + the watch
                self._gate = anyio.Semaphore(self.max_api)
                self._client = k8s.ApiClient(configuration)
                self.configuration = configuration
        return self.configuration

    @property
    def started(self) -> bool:
        return self._client is not None

    @property
    def server(self) -> str:
        return self.configuration.host if self.configuration else "?"

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        self.configuration = None

    # -- requests --------------------------------------------------------------------------

    def path(self, resource: str, name: str = "", group: str = "") -> str:
        """The path of a namespaced resource (core/v1 unless ``group``), or of one object."""
        base = (
            f"/apis/{group}/namespaces/{self.namespace}/{resource}"
            if group
            else f"/api/v1/namespaces/{self.namespace}/{resource}"
        )
        return f"{base}/{name}" if name else base

    async def open(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        timeout: float | None = None,
        content_type: str = "application/json",
    ) -> aiohttp.ClientResponse:
        """One raw request (auth from the configuration); the caller reads and releases."""
        await self.start()
        assert self._client is not None
        return await self._client.call_api(
            path,
            method,
            query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout or self.api_timeout,
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        retry_for: float | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """A JSON request under the API gate, each attempt under ``api_timeout``, retried with
        exponential backoff and jitter on 429 (after its Retry-After), 5xx and connection
        errors for up to ``retry_for`` seconds (``api_retry_for`` by default: an API server
        restart is survived). Raises ApiError for other answers, BackendUnavailable when
        the time runs out."""
        await self.start()
        assert self._gate is not None
        attempts = Attempts(
            API_BACKOFF, deadline=anyio.current_time() + (self.api_retry_for if retry_for is None else retry_for)
        )
        while True:
            asked: float | None = None
            try:
                if self._rate is not None:
                    await self._rate.take()
                async with self._gate:
                    self.stats["api_calls"] += 1
                    verb = f"api_{method}"
                    self.stats[verb] = self.stats.get(verb, 0) + 1
                    with anyio.fail_after(self.api_timeout):
                        response = await self.open(method, path, query=query, body=body, content_type=content_type)
                        try:
                            if response.status >= 300:
                                raise await api_error(response)
                            data = await response.read()
                        finally:
                            response.release()
                return json.loads(data) if data else {}
            except ApiError as exc:
                if not retryable(exc):
                    raise
                why = str(exc)
                if exc.retry_after:
                    asked = min(exc.retry_after, MAX_RETRY_AFTER)
            except (TimeoutError, OSError, aiohttp.ClientError) as exc:
                why = f"cannot connect: {type(exc).__name__}: {exc}"
            pause = attempts.next_pause(asked)
            if pause is None:
                raise BackendUnavailable(f"Kubernetes API at {self.server} ({what}): {why}")
            self.stats["api_retries"] += 1
            await anyio.sleep(pause)

    async def list_page(self, path: str, selector: str, what: str, token: str = "") -> dict[str, Any]:
        """One page (500 objects) of a list by label selector; its metadata has the
        ``continue`` token of the next and the list's ``resourceVersion``."""
        query = [("labelSelector", selector), ("limit", "500")]
        if token:
            query.append(("continue", token))
        return await self.request("GET", path, query=query, what=what)

    async def pages(self, path: str, selector: str, what: str) -> AsyncIterator[list[dict[str, Any]]]:
        """A list by label selector one page at a time: a caller that keeps only what it
        needs of each page holds one page (500 objects) in memory, not the whole list."""
        token = ""
        while True:
            page = await self.list_page(path, selector, what, token)
            yield page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    async def list_all(self, path: str, selector: str, what: str) -> list[dict[str, Any]]:
        """Every object of a list by label selector, page by page."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            page = await self.list_page(path, selector, what, token)
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    async def delete(self, path: str, what: str) -> None:
        """Delete with grace 0 and background propagation (one call; the kubelet stops the
        containers after); an object already gone is fine."""
        query = [("gracePeriodSeconds", "0"), ("propagationPolicy", "Background")]
        try:
            await self.request("DELETE", path, query=query, what=what, retry_for=DELETE_RETRY_FOR)
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def last_warning(self, name: str) -> str:
        """The newest Warning event about the pod, if the API answers quickly."""
        query = [("fieldSelector", f"involvedObject.name={name},type=Warning")]
        try:
            with anyio.fail_after(5):
                events = await self.request("GET", self.path("events"), query=query, what="events", retry_for=0)
        except (OrchardError, ApiError, TimeoutError):
            return ""
        items = sorted(events.get("items") or [], key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        if not items:
            return ""
        return f"{items[-1].get('reason')}: {items[-1].get('message')}"

    async def version(self) -> dict[str, Any]:
        """The server's /version with a client of its own, within 10 s; AdapterUnavailable
        when there is no configuration or no answer (for ``doctor``)."""
        configuration = await self.load_configuration()
        client = k8s.ApiClient(configuration)
        try:
            with anyio.fail_after(10):
                response = await client.call_api(
                    "/version",
                    "GET",
                    header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _request_timeout=10,
                )
                try:
                    if response.status >= 300:
                        raise await api_error(response)
                    version = json.loads(await response.read())
                finally:
                    response.release()
        except (TimeoutError, OSError, aiohttp.ClientError, ApiError) as exc:
            raise AdapterUnavailable(
                f"cannot reach the Kubernetes API at {configuration.host} ({self.where}): {type(exc).__name__}: {exc}"
            ) from None
        finally:
            await client.close()
        return {**version, "host": configuration.host}

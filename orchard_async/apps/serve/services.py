"""Services inside a sandbox, reached from outside: ``POST /sandboxes/{id}/services`` and the
``/s/{token}/...`` proxy (Orchard's services API; docs/service-api.md).

Off unless ``serve --services``. A caller with the sandbox's key exposes a port and gets a URL
that carries a token; whoever holds the URL reaches that one port of that one sandbox, over
HTTP or WebSocket, with no API key (an OpenEnv ``EnvClient`` or an MCP client cannot add one).
The token is ``base64url(payload).base64url(HMAC-SHA256(secret, payload))``, the payload naming
the key's tenant, the sandbox, the port, the expiry and the exposure (a random id). Every
request checks, in order: the signature, the expiry, that the exposure still exists (a
``DELETE`` revokes it at once, and exposing the port again makes a new one, so an old URL stays
dead), and that its sandbox is still the one the service holds under that id. The secret is
made per process: URLs die with the service, as the exposures do.

The bytes go through the library's ``connect`` (a relay process in the sandbox over the
adapter's stream), never over the sandbox's network: a sandbox without network serves as well,
on every adapter with streams. HTTP goes through a pool of kept-alive connections per
exposure (upstream.py: h11, each connection one relay); a WebSocket is ended
here (aiohttp) and opened again to the sandbox with wsproto over one ``connect``, frames copied
both ways, close codes passed on. Revoking, or the token expiring, ends open WebSockets too.

Never exposable: the port the service itself listens on (a sandbox sharing the host's network
would reach the service's API through its own proxy) and the adapter's control port in its
sandboxes (the kubernetes pod relay's).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from aiohttp import WSMsgType, web
from wsproto.utilities import LocalProtocolError

import orchard_async as oa
from orchard_async.apps.serve.schema import ApiError, decode
from orchard_async.apps.serve.upstream import UpstreamPool
from orchard_async.capabilities import Exposes

if TYPE_CHECKING:
    from orchard_async.apps.serve.registry import Box, Registry

log = logging.getLogger("orchard_async.apps.serve.services")

DEFAULT_TTL = 3600  # seconds a URL lives when the request names none
MAX_TTL = 7 * 24 * 3600
PROBE_INTERVAL = 0.25  # between wait_ready probes
# Not passed on to the sandbox (RFC 9110 hop-by-hop, and what the proxy sets itself); the
# service's own credentials never reach sandbox code either (see forwarded_headers).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "x-api-key",
    }
)
# a side of a proxied WebSocket gone: the other is closed, nothing to report
BROKEN = (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError, LocalProtocolError)
WS_HANDSHAKE = frozenset(
    {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol"}
)


class ServiceRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    port: int
    ttl_seconds: int | None = None
    wait_ready: bool = False
    health_path: str = "/health"
    ready_timeout: float = 60.0


class Exposure:
    """One exposed port of one sandbox: what its tokens name, and its open traffic."""

    def __init__(self, box: Box, port: int):
        self.id = secrets.token_urlsafe(12)
        self.box = box
        self.port = port
        self.http: UpstreamPool | None = None  # made on the first HTTP request
        self.sockets: set[anyio.CancelScope] = set()  # open WebSockets, cut on revocation

    def client(self, sandbox: oa.Sandbox) -> UpstreamPool:
        if self.http is None:
            self.http = UpstreamPool(sandbox, self.port)
        return self.http

    async def close(self) -> None:
        for scope in list(self.sockets):
            scope.cancel()
        if self.http is not None:
            http, self.http = self.http, None
            await http.close()


class Services:
    """The service's exposures and the key that signs their tokens."""

    def __init__(self, registry: Registry, *, enabled: bool):
        self.registry = registry
        self.enabled = enabled
        self._secret = secrets.token_bytes(32)
        self._exposures: dict[str, Exposure] = {}  # by exposure id
        self._by_port: dict[tuple[int, int], Exposure] = {}  # (id(box), port)

    # -- tokens -------------------------------------------------------------------------------

    def mint(self, exposure: Exposure, expires_at: int) -> str:
        payload = msgspec.json.encode(
            [exposure.box.tenant.name, exposure.box.id, exposure.port, expires_at, exposure.id]
        )
        signature = hmac.new(self._secret, payload, hashlib.sha256).digest()
        return f"{_b64(payload)}.{_b64(signature)}"

    async def verify(self, token: str) -> tuple[Exposure, oa.Sandbox, float]:
        """The live exposure a token names, its sandbox and the token's expiry; 403 (one
        answer for every cause: a prober learns nothing) or 404 for a sandbox gone."""
        refused = ApiError(403, "the service URL is not valid (wrong, expired or revoked)", "bad_service_token")
        payload_text, _, signature_text = token.partition(".")
        try:
            payload, signature = _unb64(payload_text), _unb64(signature_text)
        except ValueError:
            raise refused from None
        if not hmac.compare_digest(signature, hmac.new(self._secret, payload, hashlib.sha256).digest()):
            raise refused
        tenant, sandbox_id, port, expires_at, exposure_id = msgspec.json.decode(payload)
        if time.time() >= expires_at:
            raise refused
        exposure = self._exposures.get(exposure_id)
        if exposure is None:
            raise refused  # revoked
        box = self.registry.boxes.get((tenant, sandbox_id))
        if box is not exposure.box or box.deleted or box.sandbox is None or getattr(box.sandbox, "closed", False):
            self._drop(exposure)
            await exposure.close()
            raise ApiError(404, f"sandbox {sandbox_id} is gone", "unknown_sandbox")
        box.touch()  # traffic through its services keeps a sandbox from its idle limit
        return exposure, box.sandbox, float(expires_at)

    # -- exposures ----------------------------------------------------------------------------

    async def purge(self) -> None:
        """Close the exposures of sandboxes that are gone (their kept-alive connections
        included): a deleted sandbox's URLs are refused anyway, this frees what they held."""
        for exposure in list(self._exposures.values()):
            box = exposure.box
            if box.deleted or self.registry.boxes.get((box.tenant.name, box.id)) is not box:
                self._drop(exposure)
                await exposure.close()

    def expose(self, box: Box, port: int) -> Exposure:
        key = (id(box), port)
        exposure = self._by_port.get(key)
        if exposure is None or exposure.box is not box:
            exposure = Exposure(box, port)
            self._by_port[key] = exposure
            self._exposures[exposure.id] = exposure
        return exposure

    def ports(self, box: Box) -> list[int]:
        return sorted(e.port for e in self._exposures.values() if e.box is box)

    async def revoke(self, box: Box, port: int) -> bool:
        exposure = self._by_port.get((id(box), port))
        if exposure is None or exposure.box is not box:
            return False
        self._drop(exposure)
        await exposure.close()
        return True

    def _drop(self, exposure: Exposure) -> None:
        self._exposures.pop(exposure.id, None)
        key = (id(exposure.box), exposure.port)
        if self._by_port.get(key) is exposure:
            del self._by_port[key]
        for scope in list(exposure.sockets):
            scope.cancel()

    async def close(self) -> None:
        exposures, self._exposures, self._by_port = list(self._exposures.values()), {}, {}
        for exposure in exposures:
            await exposure.close()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as exc:
        raise ValueError(str(exc)) from None


# -- routes ----------------------------------------------------------------------------------------


SERVICES = web.AppKey("services", Services)


def enabled(request: web.Request) -> Services:
    services = request.app[SERVICES]
    if not services.enabled:
        raise ApiError(
            404, "services are disabled: start the service with `orchard-async serve --services`", "services_disabled"
        )
    return services


def control_ports(request: web.Request) -> set[int]:
    """The ports a sandbox may never expose: the one this request came in on (the service's
    own) and the adapter's control port in its sandboxes, if it has one."""
    ports = set()
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if sockname:
        ports.add(sockname[1])
    relay = getattr(request.app[SERVICES].registry.adapter, "relay_port", None)
    if isinstance(relay, int):
        ports.add(relay)
    return ports


async def create_service(request: web.Request, tenant: Any) -> web.Response:
    services = enabled(request)
    body = decode(await request.read(), ServiceRequest)
    if isinstance(body.port, bool) or not 0 < body.port < 65536:
        raise ApiError(422, f"port must be from 1 to 65535, got {body.port}")
    if body.port in control_ports(request):
        raise ApiError(
            400, f"port {body.port} is reserved: the service's control port cannot be exposed", "port_reserved"
        )
    ttl = DEFAULT_TTL if body.ttl_seconds is None else body.ttl_seconds
    if not 0 < ttl <= MAX_TTL:
        raise ApiError(422, f"ttl_seconds must be between 1 and {MAX_TTL}, got {body.ttl_seconds}")
    if not body.health_path.startswith("/") or not 0 < body.ready_timeout <= 3600:
        raise ApiError(422, "health_path must start with / and ready_timeout be between 0 and 3600 seconds")
    box, sandbox = services.registry.ready(tenant, request.match_info["id"], 404)
    if not isinstance(sandbox, Exposes):  # what reaches a port in a sandbox: streams (sim has none)
        raise ApiError(
            400, f"the {services.registry.adapter.name} adapter cannot reach ports in its sandboxes", "no_streams"
        )
    await services.purge()
    exposure = services.expose(box, body.port)
    if body.wait_ready:
        await wait_ready(exposure, sandbox, body.health_path, body.ready_timeout)
    expires_at = int(time.time()) + ttl
    token = services.mint(exposure, expires_at)
    log.info("exposed port %d of %s for %ds", body.port, box.id, ttl)  # never the token: it is the credential
    url = f"{request.url.origin()}/s/{token}"
    return _json({"sandbox_id": box.id, "port": body.port, "url": url, "expires_at": float(expires_at)})


async def wait_ready(exposure: Exposure, sandbox: oa.Sandbox, path: str, within: float) -> None:
    """Until ``path`` answers anything but a 5xx, or 408: the sandbox is ready before the
    server a command started in it is."""
    http = exposure.client(sandbox)
    with anyio.move_on_after(within):
        while True:
            with contextlib.suppress(OSError, oa.ConfigError, *BROKEN), anyio.move_on_after(max(1.0, within / 4)):
                exchange = await http.request("GET", path, [], b"")
                try:
                    async for _ in exchange.body():
                        pass
                finally:
                    await exchange.close()
                if exchange.status < 500:
                    return
            await anyio.sleep(PROBE_INTERVAL)
    raise ApiError(408, f"nothing answered {path} on port {exposure.port} within {within:g}s", "service_not_ready")


async def list_services(request: web.Request, tenant: Any) -> web.Response:
    services = enabled(request)
    box = services.registry.get(tenant, request.match_info["id"], touch=False)
    return _json({"sandbox_id": box.id, "ports": services.ports(box)})


async def delete_service(request: web.Request, tenant: Any) -> web.Response:
    services = enabled(request)
    box = services.registry.get(tenant, request.match_info["id"])
    raw = request.match_info["port"]
    if not raw.isdigit() or not await services.revoke(box, int(raw)):
        raise ApiError(404, f"port {raw} is not exposed for sandbox {box.id}", "not_exposed")
    return _json({"status": "revoked", "sandbox_id": box.id, "port": int(raw)})


def _json(payload: Any) -> web.Response:
    return web.Response(body=msgspec.json.encode(payload), content_type="application/json")


# -- the proxy ---------------------------------------------------------------------------------------


def forwarded_headers(request: web.Request) -> list[tuple[str, str]]:
    """The caller's headers for the sandbox: without hop-by-hop ones, the WebSocket
    handshake's (the proxy makes its own) and the service's API key. ``Authorization`` is
    passed on: the URL is this service's credential, so that header is the sandbox server's."""
    return [
        (name, value)
        for name, value in request.headers.items()
        if name.lower() not in HOP_BY_HOP and name.lower() not in WS_HANDSHAKE
    ]


def target_of(request: web.Request) -> str:
    tail = request.match_info.get("tail", "")
    return "/" + tail + (f"?{request.query_string}" if request.query_string else "")


async def proxy(request: web.Request) -> web.StreamResponse:
    services = enabled(request)
    exposure, sandbox, expires_at = await services.verify(request.match_info["token"])
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return await proxy_websocket(request, exposure, sandbox, expires_at)
    http = exposure.client(sandbox)
    try:
        exchange = await http.request(
            request.method, target_of(request), forwarded_headers(request), await request.read()
        )
    except (OSError, oa.OrchardError, *BROKEN) as exc:
        # the detail stays in the log: a caller learns nothing of the sandbox's insides
        log.warning("service proxy to port %d of %s: %s", exposure.port, exposure.box.id, exc)
        raise ApiError(502, "the service in the sandbox did not answer", "service_unreachable") from None
    try:
        response = web.StreamResponse(status=exchange.status, reason=exchange.reason or None)
        for name, value in exchange.headers:
            if name.lower() not in HOP_BY_HOP or name.lower() == "content-length":
                response.headers.add(name, value)
        await response.prepare(request)
        async for chunk in exchange.body():
            await response.write(chunk)
        await response.write_eof()
        return response
    finally:
        await exchange.close()


async def proxy_websocket(
    request: web.Request, exposure: Exposure, sandbox: oa.Sandbox, expires_at: float
) -> web.StreamResponse:
    from orchard_async.apps.serve.websocket import UpstreamWebSocket

    protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    try:
        upstream = await UpstreamWebSocket.open(
            sandbox, exposure.port, target_of(request), forwarded_headers(request), protocols
        )
    except ConnectionRefusedError:
        raise ApiError(502, "the service in the sandbox did not answer", "service_unreachable") from None
    except (OSError, oa.OrchardError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
        log.warning("service websocket to port %d of %s: %s", exposure.port, exposure.box.id, exc)
        raise ApiError(502, "the service in the sandbox did not answer", "service_unreachable") from None
    if upstream.rejected is not None:
        await upstream.close()
        raise ApiError(upstream.rejected, "the service in the sandbox refused the WebSocket", "websocket_refused")
    downstream = web.WebSocketResponse(
        protocols=(upstream.subprotocol,) if upstream.subprotocol else (), max_msg_size=0, autoping=True
    )
    await downstream.prepare(request)
    scope = anyio.CancelScope(deadline=anyio.current_time() + max(0.0, expires_at - time.time()))
    exposure.sockets.add(scope)
    close_code = 1000
    try:
        with scope:
            async with anyio.create_task_group() as group:

                async def to_sandbox() -> None:
                    with contextlib.suppress(*BROKEN):
                        async for message in downstream:
                            if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                                await upstream.send(message.data)
                            else:
                                break
                        await upstream.send_close(downstream.close_code or 1000)

                async def from_sandbox() -> None:
                    nonlocal close_code
                    with contextlib.suppress(*BROKEN):
                        async for data in upstream.messages():
                            if isinstance(data, str):
                                await downstream.send_str(data)
                            else:
                                await downstream.send_bytes(data)
                    close_code = upstream.close_code or 1000
                    group.cancel_scope.cancel()

                group.start_soon(to_sandbox)
                await from_sandbox()
        if scope.cancelled_caught:
            close_code = 1008  # policy violation: revoked or expired
    finally:
        exposure.sockets.discard(scope)
        with anyio.CancelScope(shield=True):
            await upstream.close()
            await downstream.close(code=close_code, message=upstream.close_reason.encode()[:120])
    return downstream

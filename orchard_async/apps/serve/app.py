"""The HTTP API of Orchard Env (see orchard-env-api.md), on aiohttp, over any adapter.

Every answer, errors and DELETE included, is a JSON object with ``application/json``:
Orchard's clients parse every body. Errors carry ``detail`` (one line) and ``reason`` (a
fixed word). Sandboxes are driven through the public adapter API only, so every adapter
works behind the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

import orchard_async as oa
from orchard_async.apps.serve import adopt, network, pty, resources, services
from orchard_async.apps.serve.jobs import Job, Jobs
from orchard_async.apps.serve.keys import ANONYMOUS, KeyStore, Tenant
from orchard_async.apps.serve.metrics import Metrics
from orchard_async.apps.serve.registry import Registry
from orchard_async.apps.serve.schema import (
    ApiError,
    CreateRequest,
    ExecRequest,
    PatchRequest,
    UploadRequest,
    b64decode,
    b64encode,
    decode,
)

log = logging.getLogger("orchard_async.apps.serve")
access_log = logging.getLogger("orchard_async.apps.serve.access")

PUBLIC_PATHS = frozenset({"/", "/health"})
MAX_WAIT = 3600  # seconds a /wait may block
# seconds after start of the second backend reap: past the 60 s a local dir without its lease is
# left alone (adapters/local_reap.py) and docker's attach grace for a container no shell took
SECOND_REAP_AFTER = 65.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

REGISTRY = web.AppKey("registry", Registry)
JOBS = web.AppKey("jobs", Jobs)
KEYS = web.AppKey("keys", KeyStore)
METRICS = web.AppKey("metrics", Metrics)
# web.RequestKey (aiohttp 3.14+) types request storage; older aiohttp (3.9+) takes a string.
TENANT: Any = web.RequestKey("tenant", Tenant) if hasattr(web, "RequestKey") else "tenant"


def reply(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(payload), status=status, content_type="application/json", headers=headers
    )


async def deliver(request: web.Request, payload: Any) -> tuple[web.Response, bool]:
    """Send a 200 answer now: (the response, for the handler to return; whether it was
    handed to a live connection, the caller not having hung up first). What the retry
    rules of jobs.py and of creates go by."""
    response = reply(payload)
    transport = request.transport
    if transport is None or transport.is_closing():
        return response, False
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionResetError:
        return response, False
    return response, True


# -- the one middleware ------------------------------------------------------------------------


@web.middleware
async def front(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Around every request: the key check, errors as JSON answers, and one structured log
    line. One middleware, not three: each is a coroutine frame on every exec's path."""
    started = time.perf_counter()
    status = 500
    try:
        try:
            # PTY: its key in-band; /s/: the URL's token is the credential (services.py)
            if request.path not in PUBLIC_PATHS and not request.path.endswith("/exec/pty") and not is_service(request):
                request[TENANT] = authenticated(request)
            response = await handler(request)
        except ApiError as exc:
            response = error_answer(request, exc.status, exc.reason, exc.detail, exc.headers)
        except web.HTTPException as exc:  # aiohttp's own: unknown route, wrong method, body too large
            if exc.status < 400:
                status = exc.status
                raise
            reason = {404: "no_route", 405: "method_not_allowed", 413: "too_large"}.get(
                exc.status, f"http_{exc.status}"
            )
            detail = exc.text if exc.status == 413 else f"{exc.reason}: {request.method} {request.path}"
            headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            response = error_answer(request, exc.status, reason, detail, headers)
        except Exception:
            log.exception("internal error on %s %s", request.method, request.path)
            response = error_answer(request, 500, "internal", "internal error (see the service's log)")
        status = response.status
        return response
    finally:
        # The path only: a query may hold an API key (PTY).
        if access_log.isEnabledFor(logging.INFO):
            tenant = request.get(TENANT)
            line = {
                "method": request.method,
                "path": "/s/<token>/..." if is_service(request) else request.path,  # the token is a credential
                "status": status,
                "ms": round((time.perf_counter() - started) * 1000, 2),
                "key": tenant.name if tenant else None,
            }
            access_log.info(json.dumps(line))


def is_service(request: web.Request) -> bool:
    return request.path.startswith("/s/")


def error_answer(
    request: web.Request, status: int, reason: str, detail: str, headers: dict[str, str] | None = None
) -> web.Response:
    request.app[METRICS].errors[reason] += 1
    return reply({"detail": detail, "reason": reason}, status, headers)


def tenant_of(request: web.Request, key: str | None) -> Tenant:
    keys = request.app[KEYS]
    if not keys.required:
        return ANONYMOUS
    if not key:
        raise ApiError(401, "an API key is required (X-API-Key header)", "no_key")
    tenant = keys.authenticate(key)
    if tenant is None:
        raise ApiError(403, "the API key is not valid", "bad_key")
    return tenant


def authenticated(request: web.Request) -> Tenant:
    key = request.headers.get("X-API-Key")
    if key is None and request.headers.get("Authorization", "").startswith("Bearer "):
        key = request.headers["Authorization"][len("Bearer ") :]  # Prometheus scrapes send this
    return tenant_of(request, key)


# -- sandboxes ----------------------------------------------------------------------------------


async def root(request: web.Request) -> web.Response:
    return reply({"service": "orchard-async", "version": oa.__version__, "api": "orchard-env"})


async def health(request: web.Request) -> web.Response:
    return reply({"status": "healthy", "adapter": request.app[REGISTRY].adapter.name})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=request.app[METRICS].render(), content_type="text/plain", charset="utf-8")


async def get_resources(request: web.Request) -> web.Response:
    """What this key can still create: the quotas' room and the backend's capacity."""
    answer = resources.quotas(request.app[REGISTRY], request[TENANT])
    answer["can_create"] = resources.can_create(answer)
    answer["backend"] = await resources.backend(request.app[REGISTRY].adapter)
    return reply({"status": "ok", **answer})


async def create_sandbox(request: web.Request) -> web.StreamResponse:
    registry = request.app[REGISTRY]
    body = decode(await request.read(), CreateRequest)
    box = registry.create(request[TENANT], body, request.transport)
    response, delivered = await deliver(request, box.describe())
    if delivered:
        registry.answered(box)
    return response


async def list_sandboxes(request: web.Request) -> web.Response:
    tenant = request[TENANT]
    boxes = [box.describe() for (name, _), box in request.app[REGISTRY].boxes.items() if name == tenant.name]
    return reply({"sandboxes": boxes})


async def get_sandbox(request: web.Request) -> web.Response:
    return reply(request.app[REGISTRY].get(request[TENANT], request.match_info["id"], touch=False).describe())


def int_query(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(422, f"query parameter {name} must be a whole number of seconds, got {raw!r}") from None
    if value < 0:
        raise ApiError(422, f"query parameter {name} must not be negative, got {value}")
    return value


async def wait_sandbox(request: web.Request) -> web.Response:
    registry, tenant, sandbox_id = request.app[REGISTRY], request[TENANT], request.match_info["id"]
    seconds = min(int_query(request, "timeout", 300), MAX_WAIT)
    box = registry.get(tenant, sandbox_id)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(box.ready.wait(), timeout=seconds)
    box = registry.get(tenant, sandbox_id)  # it may have been deleted meanwhile
    if box.status == "pending":
        raise ApiError(408, f"sandbox {sandbox_id} was not ready within {seconds}s", "not_ready_in_time")
    return reply(box.describe())


async def delete_sandbox(request: web.Request) -> web.Response:
    sandbox_id = request.match_info["id"]
    if not request.app[REGISTRY].delete(request[TENANT], sandbox_id):
        raise ApiError(404, f"sandbox {sandbox_id} not found", "unknown_sandbox")
    return reply({"status": "deleted", "sandbox_id": sandbox_id})


async def heartbeat(request: web.Request) -> web.Response:
    box = request.app[REGISTRY].get(request[TENANT], request.match_info["id"])
    return reply({"status": "ok", "sandbox_id": box.id})


# -- commands -----------------------------------------------------------------------------------


async def exec_command(request: web.Request) -> web.StreamResponse:
    registry, jobs, tenant = request.app[REGISTRY], request.app[JOBS], request[TENANT]
    body = decode(await request.read(), ExecRequest)
    if body.command in ("", []):
        raise ApiError(422, "command must not be empty")
    if body.timeout_seconds is not None and not body.timeout_seconds > 0:
        raise ApiError(422, f"timeout_seconds must be a positive number, got {body.timeout_seconds}")
    try:
        oa.types.check_env(body.env)
    except oa.ConfigError as exc:
        raise ApiError(422, str(exc)) from None
    box, _ = registry.ready(tenant, request.match_info["id"], 404)
    key = request.headers.get("Idempotency-Key")
    job = jobs.original(tenant.name, box, body, key)
    if job is None and key is not None and box.readopted and request.headers.get("X-Orchard-Retry") == "1":
        return reply(jobs.cut_by_restart(box, body))
    if job is None:
        job = jobs.start(tenant.name, box, body, key, registry.spawn)
        job.origin = request.transport
    if body.wait is True or (body.mode == "native" and body.wait is not False):
        await jobs.wait(job, jobs.wait_window(job))
    return await _answer(request, job)


async def _answer(request: web.Request, job: Job) -> web.StreamResponse:
    response, delivered = await deliver(request, job.to_json())
    job.delivered = job.delivered or delivered
    return response


async def get_job(request: web.Request) -> web.Response:
    job_id = request.match_info["job_id"]
    if (lost := request.app[JOBS].lost_in_restart(job_id)) is not None:
        return reply(lost)
    return reply(request.app[JOBS].get(request[TENANT].name, job_id).to_json())


async def wait_job(request: web.Request) -> web.StreamResponse:
    jobs, job_id = request.app[JOBS], request.match_info["job_id"]
    if (lost := jobs.lost_in_restart(job_id)) is not None:
        return reply(lost)
    job = jobs.get(request[TENANT].name, job_id)
    await jobs.wait(job, min(int_query(request, "timeout", 300), MAX_WAIT))
    return await _answer(request, job)


async def apply_patch(request: web.Request) -> web.Response:
    body = decode(await request.read(), PatchRequest)
    box, sandbox = request.app[REGISTRY].ready(request[TENANT], request.match_info["id"], 400)
    try:
        async with box.lock:
            result = await sandbox.apply_patch(body.patch, cwd=box.path(body.cwd) if body.cwd else None)
    except Exception as exc:  # noqa: BLE001 - mapped to its answer, or raised again
        raise _file_errors(body.cwd or ".", exc) from None
    answer: dict[str, Any] = {
        "success": result.ok,
        "stdout": result.text,
        "stderr": result.error_text,
        "exit_code": result.exit_code,
    }
    if not result.ok:
        answer["error"] = result.error_text.strip() or f"{result.reason} (exit code {result.exit_code})"
    return reply(answer)


# -- files --------------------------------------------------------------------------------------


def _file_errors(path: str, exc: Exception) -> ApiError:
    if isinstance(exc, oa.PathOutsideSandbox):
        return ApiError(400, str(exc), "path_outside")
    if isinstance(exc, FileNotFoundError):
        return ApiError(404, f"{path}: no such file or directory", "no_such_file")
    if isinstance(exc, oa.SandboxLost):
        return ApiError(410, str(exc), "sandbox_lost")
    if isinstance(exc, oa.ConfigError | OSError):
        return ApiError(400, one_line(exc), "file_error")
    raise exc


def one_line(exc: BaseException) -> str:
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def path_query(request: web.Request) -> str:
    path = request.query.get("path")
    if not path:
        raise ApiError(422, "query parameter path is required")
    return path


async def upload(request: web.Request) -> web.Response:
    body = decode(await request.read(), UploadRequest)
    data = b64decode(body.content, "content")
    box, sandbox = request.app[REGISTRY].ready(request[TENANT], request.match_info["id"], 400)
    try:
        await sandbox.write_file(box.path(body.path), data, mode=body.mode)
    except Exception as exc:  # noqa: BLE001 - mapped to its answer, or raised again
        raise _file_errors(body.path, exc) from None
    return reply({"success": True, "path": body.path, "size": len(data)})


async def download(request: web.Request) -> web.Response:
    path = path_query(request)
    box, sandbox = request.app[REGISTRY].ready(request[TENANT], request.match_info["id"], 400)
    try:
        data = await sandbox.read_file(box.path(path))
    except Exception as exc:  # noqa: BLE001
        raise _file_errors(path, exc) from None
    return reply({"path": path, "content": b64encode(data), "size": len(data)})


async def list_files(request: web.Request) -> web.Response:
    path = path_query(request)
    box, sandbox = request.app[REGISTRY].ready(request[TENANT], request.match_info["id"], 400)
    try:
        entries = await sandbox.list_dir(box.path(path))
    except Exception as exc:  # noqa: BLE001
        raise _file_errors(path, exc) from None
    files = [
        {
            "name": entry.name,
            "type": "directory" if entry.is_dir else "file",
            "size": entry.size,
            "modified": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(entry.mtime)),
            "mode": entry.mode,  # extensions: what FileInfo needs
            "mtime": entry.mtime,
            "full_path": entry.path,
        }
        for entry in entries
    ]
    return reply({"path": path, "files": files})


# -- sessions (extension: the remote adapter's Sandbox.session()) -------------------------------


async def open_session(request: web.Request) -> web.Response:
    box, sandbox = request.app[REGISTRY].ready(request[TENANT], request.match_info["id"], 404)
    stack = contextlib.AsyncExitStack()
    session = await stack.enter_async_context(sandbox.session())
    session_id = f"s{len(box.sessions) + 1}-{int(time.time() * 1000) % 100000}"
    box.sessions[session_id] = (stack, session)
    return reply({"session_id": session_id, "sandbox_id": box.id})


async def close_session(request: web.Request) -> web.Response:
    box = request.app[REGISTRY].get(request[TENANT], request.match_info["id"])
    found = box.sessions.pop(request.match_info["session_id"], None)
    if found is None:
        raise ApiError(404, f"session {request.match_info['session_id']} not found", "unknown_session")
    await found[0].aclose()
    return reply({"status": "closed", "session_id": request.match_info["session_id"]})


# -- services (services.py; off unless `serve --services`) ---------------------------------------


async def create_service(request: web.Request) -> web.Response:
    return await services.create_service(request, request[TENANT])


async def list_services(request: web.Request) -> web.Response:
    return await services.list_services(request, request[TENANT])


async def delete_service(request: web.Request) -> web.Response:
    return await services.delete_service(request, request[TENANT])


# -- the application ----------------------------------------------------------------------------


def create_app(
    adapter: oa.Adapter,
    *,
    keys: KeyStore | None = None,
    max_body: int = 64 << 20,
    max_sandboxes: int = 1000,
    default_ttl: float = 3600.0,
    max_ttl: float = 24 * 3600.0,
    idle_timeout: float = 1800.0,
    reap_interval: float = 5.0,
    close_adapter: bool = True,
    service_name: str = "",
    expose_services: bool = False,
) -> web.Application:
    """The service over ``adapter``. On shutdown every sandbox it holds is destroyed (and
    the adapter closed, unless ``close_adapter`` is False). With a ``service_name`` its
    sandboxes carry it, and a restart with the same name re-adopts them (adopt.py).
    ``expose_services``: the services routes and their proxy (services.py), off by default."""
    app = web.Application(middlewares=[front], client_max_size=max_body)
    metrics_ = Metrics(lambda: registry.live_counts())
    registry = Registry(
        adapter,
        metrics_,
        max_sandboxes=max_sandboxes,
        default_ttl=default_ttl,
        max_ttl=max_ttl,
        idle_timeout=idle_timeout,
        service_name=service_name,
    )
    # ORCHARD_SERVE_BASH_LANE=0: Orchard commands always as a new `bash -c` process (lane.py), for
    # comparison (the bench's plain way) or if a lane ever misbehaves.
    jobs = Jobs(metrics_, bash_lanes=os.environ.get("ORCHARD_SERVE_BASH_LANE", "1") != "0")
    app[REGISTRY], app[JOBS], app[KEYS], app[METRICS] = registry, jobs, keys or KeyStore(), metrics_
    app[services.SERVICES] = exposures = services.Services(registry, enabled=expose_services)

    async def reap_half_made() -> None:
        # A sandbox the killed run was half-way through making is not yet reap-able at start
        # (a local dir without its lease is left alone while young, a container waits out its
        # attach grace): look again once that has passed.
        await asyncio.sleep(SECOND_REAP_AFTER)
        try:
            reaped = await adapter.reap()
        except oa.OrchardError as exc:  # the next start reaps again
            log.warning("the second reap failed: %s", exc)
            return
        for sandbox_id in reaped:
            log.info("reaped %s, left half-made by a run that is gone", sandbox_id)

    async def lifetime(app: web.Application) -> Any:
        # Sandboxes a killed earlier run of the service left (their controller is dead): the
        # service's state is gone with it, so none can be adopted; remove them.
        handed_out = adopt.handed_out(registry)
        for sandbox_id in await adapter.reap():
            log.info("reaped %s, left by a run that is gone", sandbox_id)
            if sandbox_id in handed_out:
                adopt.lost_in_restart(registry, handed_out[sandbox_id])
        # ...but those this service made, with a reattach grace, wait for it: take them back
        tenants = {tenant.name: tenant for tenant in app[KEYS].tenants} or {ANONYMOUS.name: ANONYMOUS}
        await adopt.adopt(registry, tenants)
        reaper = registry.spawn(registry.reaper(reap_interval))
        second_reap = registry.spawn(reap_half_made())
        yield
        reaper.cancel()
        second_reap.cancel()
        await exposures.close()
        await registry.close()
        if close_adapter:
            await adapter.close()

    app.cleanup_ctx.append(lifetime)
    app.router.add_get("/", root)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/resources", get_resources)
    app.router.add_post("/sandboxes", create_sandbox)
    app.router.add_get("/sandboxes", list_sandboxes)
    app.router.add_get("/sandboxes/{id}", get_sandbox)
    app.router.add_delete("/sandboxes/{id}", delete_sandbox)
    app.router.add_get("/sandboxes/{id}/wait", wait_sandbox)
    app.router.add_post("/sandboxes/{id}/heartbeat", heartbeat)
    app.router.add_post("/sandboxes/{id}/exec", exec_command)
    app.router.add_get("/sandboxes/{id}/exec/pty", pty.handle)
    app.router.add_post("/sandboxes/{id}/apply_patch", apply_patch)
    app.router.add_get("/sandboxes/{id}/network", network.get_network)
    app.router.add_put("/sandboxes/{id}/network", network.put_network)
    app.router.add_post("/sandboxes/{id}/files", upload)
    app.router.add_get("/sandboxes/{id}/files", download)
    app.router.add_get("/sandboxes/{id}/files/list", list_files)
    app.router.add_post("/sandboxes/{id}/sessions", open_session)
    app.router.add_delete("/sandboxes/{id}/sessions/{session_id}", close_session)
    app.router.add_post("/sandboxes/{id}/services", create_service)
    app.router.add_get("/sandboxes/{id}/services", list_services)
    app.router.add_delete("/sandboxes/{id}/services/{port}", delete_service)
    app.router.add_route("*", "/s/{token}", services.proxy)
    app.router.add_route("*", "/s/{token}/{tail:.*}", services.proxy)
    app.router.add_get("/jobs/{job_id}", get_job)
    app.router.add_get("/jobs/{job_id}/wait", wait_job)
    return app

"""``GET/PUT /sandboxes/{id}/network``: a sandbox's egress read and switched at run time, with
Orchard Env's shapes (``{"mode": "enabled" | "restricted", "allowlist": [{cidr, protocol,
port_start, port_end}]}``) over the library's ``set_network`` (``capabilities.NetworkControl``).

Every answer carries ``revision`` too (an extension: how many changes the sandbox has had). A
PUT applies only at the revision it names (``"revision": n``, an extension) or, naming none,
at the one the service saw when the request arrived: a change that lost to a concurrent one
is a 409 (``network_conflict``), to be re-read and retried, never forced."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

import orchard_async as oa
from orchard_async.apps.serve.schema import ApiError, decode
from orchard_async.capabilities import NetworkControl, NetworkState, network_policy


class NetworkRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    mode: str
    allowlist: list[dict[str, Any]] = []
    revision: int | None = None  # extension: apply only at this revision


def network_answer(sandbox_id: str, state: NetworkState) -> dict[str, Any]:
    return {
        "sandbox_id": sandbox_id,
        "mode": state.mode,
        "allowlist": [msgspec.to_builtins(rule) for rule in state.allow],
        "revision": state.revision,
    }


def _switchable(request: web.Request) -> tuple[str, NetworkControl]:
    from orchard_async.apps.serve.app import REGISTRY, TENANT  # the app imports this module

    box, sandbox = request.app[REGISTRY].ready(request[TENANT], request.match_info["id"], 400)
    if not isinstance(sandbox, NetworkControl):
        raise ApiError(400, f"this service's adapter cannot switch sandbox {box.id}'s network", "network_unsupported")
    return box.id, sandbox


async def get_network(request: web.Request) -> web.Response:
    from orchard_async.apps.serve.app import reply

    sandbox_id, sandbox = _switchable(request)
    return reply(network_answer(sandbox_id, await sandbox.get_network()))


async def put_network(request: web.Request) -> web.Response:
    from orchard_async.apps.serve.app import one_line, reply

    body = decode(await request.read(), NetworkRequest)
    try:
        policy = network_policy(body.mode, body.allowlist)
    except oa.ConfigError as exc:
        raise ApiError(422, one_line(exc), "invalid") from None
    sandbox_id, sandbox = _switchable(request)
    revision = body.revision if body.revision is not None else (await sandbox.get_network()).revision
    try:
        state = await sandbox.set_network(policy.mode, policy.allow, revision=revision)
    except oa.NetworkConflict as exc:
        raise ApiError(409, one_line(exc), "network_conflict") from None
    except oa.SandboxLost as exc:
        raise ApiError(410, one_line(exc), "sandbox_lost") from None
    except oa.ConfigError as exc:
        raise ApiError(400, one_line(exc), "network_unsupported") from None
    return reply(network_answer(sandbox_id, state))

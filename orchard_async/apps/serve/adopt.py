"""Re-adopting sandboxes after a restart: the service keeps nothing on its own disk.

What a restarted service must know of a sandbox lives with the sandbox:

* its labels (set by the adapter, out of reach of the sandbox's commands) say whose it is:
  the service instance (``orchard.serve.name``, from ``serve --name``), the tenant (the API
  key's name) and its public id;
* a record inside it (``RECORD``, written after the create) holds the create request and its
  time, for ``GET /sandboxes/{id}`` and for telling a retried create from a conflicting one.
  A sandbox's commands can change the record; that changes only how their own sandbox is
  described (owner and id come from the labels), and a missing or garbled record only
  loses the description.

At start the service lists the backend's live sandboxes with its name, answers 503 (retry)
for ids it does not know until that list is in, registers each sandbox of a known key at
once as ``pending`` (so quotas count it and ``/wait`` waits for it), and re-attaches a shell
to each in the background (``capabilities.Reattach``). One that cannot be attached (it ended, its
TTL passed) is removed and its id answers 404 saying it was lost in the restart. Sandboxes
of a key no longer in the keys file are removed. Adapters without ``Reattach`` (local: its
sandboxes end with the controller's pipes) re-adopt nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import msgspec

from orchard_async.apps.serve.keys import Tenant
from orchard_async.apps.serve.schema import CreateRequest
from orchard_async.capabilities import Reattach, facts_of
from orchard_async.errors import InfraError, OrchardError, SandboxLost
from orchard_async.kit.container_shell import CTL_DIR
from orchard_async.kit.labels import expiry

if TYPE_CHECKING:
    from orchard_async.apps.serve.registry import Box, Registry

log = logging.getLogger("orchard_async.apps.serve")

RECORD = f"{CTL_DIR}/serve-request.json"
ATTACH_ATTEMPTS = 3  # a backend that does not answer, or a sandbox busy with an ending session
ATTACH_PAUSE = 2.0


class Record(msgspec.Struct, kw_only=True):
    request: CreateRequest
    created_at: float
    ttl: float


def can_adopt(adapter: object) -> TypeGuard[Reattach]:
    return isinstance(adapter, Reattach)


async def write_record(box: Box) -> None:
    """The create's request, into the sandbox, for a restarted service (see the module docstring)."""
    assert box.sandbox is not None
    record = Record(request=box.request, created_at=box.created_at, ttl=box.ttl)
    try:
        await box.sandbox.write_file(RECORD, msgspec.json.encode(record), mode=0o600)
    except (OrchardError, OSError) as exc:  # the sandbox still serves; a restart describes it less well
        log.warning("could not write the restart record of %s: %s", box.id, exc)


async def read_record(box: Box) -> Record | None:
    assert box.sandbox is not None
    try:
        return msgspec.json.decode(await box.sandbox.read_file(RECORD), type=Record)
    except (OrchardError, OSError, msgspec.DecodeError) as exc:
        log.warning("restart record of %s unreadable (%s); describing it from its labels", box.id, exc)
        return None


async def adopt(registry: Registry, tenants: dict[str, Tenant]) -> None:
    """List the backend's sandboxes of this service and start re-attaching them."""
    from orchard_async.apps.serve.registry import ID_LABEL, NAME_LABEL, TENANT_LABEL, Box

    adapter = registry.adapter
    if not registry.service_name or not can_adopt(adapter):
        log.info("the %s adapter cannot re-adopt sandboxes: a restart starts with none", adapter.name)
        return
    registry.adopting = True
    try:
        found = await adapter.find_sandboxes({NAME_LABEL: registry.service_name})
    except (OrchardError, OSError) as exc:
        # they end themselves after their reattach grace; nothing else can be done
        log.warning("could not list sandboxes to re-adopt: %s", exc)
        registry.adopting = False
        return
    for sandbox_id, labels in found.items():
        tenant, public_id = tenants.get(labels.get(TENANT_LABEL, "")), labels.get(ID_LABEL)
        if tenant is None or not public_id or (tenant.name, public_id) in registry.boxes:
            registry.spawn(_remove(adapter, sandbox_id, f"key {labels.get(TENANT_LABEL)!r} is not in the keys file"))
            continue
        request = CreateRequest(image=None, sandbox_id=public_id)  # until the record is read back
        expires_at = expiry(labels)
        box = Box(public_id, tenant, request, max(1.0, expires_at - time.time()), registry.idle_timeout)
        box.adopting, box.readopted, box.expires_at = True, True, expires_at
        registry.boxes[(tenant.name, public_id)] = box
        registry.spawn(_attach(registry, adapter, box, sandbox_id))
    registry.adopting = False
    log.info("re-adopting %d sandboxes of service %s", len(found), registry.service_name)


SHELL_ENDED = "its shell ended with the service's process (the local adapter cannot re-adopt)"


def handed_out(registry: Registry) -> dict[str, tuple[str, str]]:
    """Adapters whose sandboxes die with the service (local: its sandboxes' shells are the
    service's children) re-adopt nothing, and the reap at start removes what is left. Read
    before that reap: the (key, public id) of each sandbox dir this service had handed out,
    from its lease file, so that ``lost_in_restart`` can make their ids answer 404
    ``sandbox_lost`` saying why, not a bare "not found"."""
    from orchard_async.apps.serve.registry import ID_LABEL, NAME_LABEL, TENANT_LABEL

    host_dir = facts_of(registry.adapter).host_dir
    if not registry.service_name or can_adopt(registry.adapter) or host_dir is None:
        return {}
    found = {}
    for lease_file in Path(host_dir).glob("*/lease.json"):
        try:
            labels = msgspec.json.decode(lease_file.read_bytes()).get("labels") or {}
        except (OSError, msgspec.DecodeError, AttributeError):
            continue  # half-written: the sandbox never was handed out
        if labels.get(NAME_LABEL) == registry.service_name and labels.get(ID_LABEL):
            found[lease_file.parent.name] = (labels.get(TENANT_LABEL, ""), labels[ID_LABEL])
    return found


def lost_in_restart(registry: Registry, public: tuple[str, str]) -> None:
    registry.lost[public] = SHELL_ENDED
    registry.metrics.deletes[(public[0], "lost_in_restart")] += 1


async def _attach(registry: Registry, adapter: Reattach, box: Box, sandbox_id: str) -> None:
    key = (box.tenant.name, box.id)
    try:
        sandbox = await _attach_retrying(adapter, sandbox_id)
    except (InfraError, OrchardError, OSError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.warning("could not re-adopt key=%s sandbox=%s (%s): %s", box.tenant.name, box.id, sandbox_id, why)
        if registry.boxes.get(key) is box:
            del registry.boxes[key]
            registry.lost[key] = why
            registry.metrics.deletes[(box.tenant.name, "lost_in_restart")] += 1
        box.status, box.status_message = "failed", f"lost when the service restarted: {why}"
        box.adopting = False
        box.ready.set()
        return
    box.sandbox = sandbox
    record = await read_record(box)
    if record is not None:
        box.request, box.created_at, box.ttl = record.request, record.created_at, record.ttl
    else:
        box.record_missing = True
    box.expires_at = sandbox.expires_at or box.expires_at
    # Its idle clock runs from the restart (Box() started it), not from the attach: one that no
    # client claims is reaped like any idle sandbox, not kept until its TTL.
    box.adopting = False
    box.status = "ready"
    box.ready.set()
    log.info("re-adopted key=%s sandbox=%s (%s)", box.tenant.name, box.id, sandbox_id)
    if box.deleted:  # deleted while it was being re-attached
        registry.spawn(registry._destroy(box))


async def _attach_retrying(adapter: Reattach, sandbox_id: str) -> Any:
    """``attach``, again after a pause when the backend did not answer or the sandbox was busy
    (both may pass); a lost sandbox is lost at once."""
    for attempt in range(ATTACH_ATTEMPTS):
        try:
            return await adapter.attach(sandbox_id)
        except SandboxLost:
            raise
        except (InfraError, OSError):
            if attempt == ATTACH_ATTEMPTS - 1:
                raise
            await asyncio.sleep(ATTACH_PAUSE)
    raise AssertionError("unreachable")


async def _remove(adapter: Reattach, sandbox_id: str, why: str) -> None:
    """A sandbox of this service that no key can reach: attach to it to end it."""
    log.info("removing %s: %s", sandbox_id, why)
    try:
        sandbox = await adapter.attach(sandbox_id)
    except (InfraError, OrchardError, OSError):
        return  # ended already, or ends itself after its reattach grace
    await sandbox.close()

"""The network of each phase of an episode (``task.PhaseNetworks``): the engine switches the
sandbox before the task's setup, before the agent's first turn and before scoring."""

from __future__ import annotations

import time

from orchard_async.capabilities import NetworkControl
from orchard_async.errors import ConfigError
from orchard_async.protocols import Sandbox, Task
from orchard_async.records.trajectory import Op
from orchard_async.task import phase_network


async def enter_phase(task: Task, phase: str, sandbox: Sandbox, ops: list[Op], t0: float) -> None:
    """Give ``sandbox`` the network ``task`` declares for ``phase`` (nothing for a task that
    declares none), recorded as a ``network`` op when it changes. ``ConfigError`` when the
    sandbox's adapter cannot switch it."""
    wanted = phase_network(task, phase)
    if wanted is None:
        return
    if not isinstance(sandbox, NetworkControl):
        raise ConfigError(
            f"task {task.id} declares a network per phase, and this adapter's sandboxes cannot switch theirs"
        )
    if (await sandbox.get_network()).policy == wanted:
        return
    start = time.monotonic()
    try:
        await sandbox.set_network(wanted.mode, wanted.allow)
    except BaseException as exc:
        ops.append(Op("network", start - t0, time.monotonic() - start, f"{phase} {type(exc).__name__}"))
        raise
    ops.append(Op("network", start - t0, time.monotonic() - start, f"{phase} {wanted.mode}"))

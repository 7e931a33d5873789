"""Extending a live sandbox's TTL (capabilities.ExtendableTTL): an extended sandbox outlives its
first TTL and ends at the extended one; nothing inside it can extend it (writing where its timer
reads its deadline, signalling the timer); another controller's reap keeps it while extended.

Each waits out a short TTL (a few seconds of sleeping, no CPU): the extension on local-bwrap in
the default run, the rest in the soak run."""

from __future__ import annotations

import time

import anyio
import pytest

import orchard_async as oa
from orchard_async.capabilities import ExtendableTTL, TTLCapExceeded
from tests.conformance.conftest import BACKENDS, _wanted

# Where each backend's timer reads an extendable sandbox's deadline, as the sandbox sees it.
DEADLINE_PATHS = '"$ORCHARD_SANDBOX/deadline" /run/orchard-ttl/deadline'

# What an agent could try from inside: rewrite the deadline, and signal the timer's sleep with
# every signal a shell can catch, a stop and a continue, and a kill (signalling the timer shell
# itself ends the sandbox at once, or is ignored). It must still end at its TTL.
FROM_INSIDE = f"""
for f in {DEADLINE_PATHS}; do echo 9999999999 >"$f"; done 2>/dev/null
for s in HUP INT QUIT TERM USR2 ALRM STOP CONT KILL; do
  for d in /proc/[0-9]*; do
    case "$(tr '\\0' ' ' <"$d/cmdline" 2>/dev/null)" in
      "sleep "*) kill -"$s" "${{d#/proc/}}" 2>/dev/null ;;
    esac
  done
done
exit 0
"""


def waiting_backends(default: str = "local-bwrap") -> list[object]:
    """The backends the TTL waits run on: ``default`` in the default run (its budget), the rest
    in the soak run."""
    return [pytest.param(name, marks=() if name == default else pytest.mark.soak) for name in BACKENDS if _wanted(name)]


def timing(request: pytest.FixtureRequest) -> tuple[float, float, float, float, bool]:
    """(ttl, extension, how long past its first TTL (from the create's return) it must still
    answer, slack: seconds past an expiry the sandbox may take to end, whether its timer
    outlives its sleep being signalled). A pod takes seconds to start and the kubelet
    refreshes the projected deadline on its next sync of the pod: longer times there; and
    the egress filter's container, whose processes a sandbox sees (a shared PID namespace),
    may end with its sleep, and the pod with it."""
    if "kubernetes" in request.node.callspec.params["make_adapter"]:
        return 10.0, 20.0, 2.0, 15.0, False
    return 1.0, 2.5, 1.2, 4.0, True


async def lost_at(box: oa.Sandbox, by: float) -> float:
    """The wall-clock time the sandbox stopped answering (polled), or inf if it still did at ``by``."""
    while time.time() < by:
        result = await box.exec("true", timeout=5)
        if result.reason == oa.ExitReason.SANDBOX_LOST:
            return time.time()
        await anyio.sleep(0.25)
    return float("inf")


@pytest.mark.parametrize("make_adapter", waiting_backends(), indirect=True)
async def test_an_extended_sandbox_outlives_its_first_ttl_and_ends_at_the_extended_one(make_adapter, request) -> None:
    ttl, extension, alive_after, slack, _ = timing(request)
    adapter = make_adapter()
    before = time.time()
    box = await adapter.create(oa.SandboxSpec(ttl=ttl, max_extension=extension + 3.5))
    after = time.time()  # the sandbox's timer started in between: its first TTL ends by after + ttl
    try:
        assert isinstance(box, ExtendableTTL)
        extended = await box.extend_ttl(extension)
        assert before + ttl + extension - 0.1 <= extended <= after + ttl + extension + 0.1
        with pytest.raises(TTLCapExceeded, match=f"max_extension={extension + 3.5:g}"):
            await box.extend_ttl(4)  # past the cap: refused whole, nothing changes
        # past the first TTL (rounded up to whole seconds, as the timers do): still there
        await anyio.sleep(max(0.0, after + ttl + alive_after - time.time()))
        assert (await box.exec("echo alive", timeout=5)).text == "alive\n"
        # another controller's reap sees the extension and leaves it alone
        other = make_adapter()
        assert box.id not in await other.reap()
        gone = await lost_at(box, extended + slack)
        assert extended - 0.5 <= gone <= extended + slack, (gone - extended, "seconds after the extended expiry")
        with pytest.raises(oa.SandboxLost):
            await box.extend_ttl(1)
    finally:
        await box.close()


@pytest.mark.parametrize("max_extension", [0, 60], ids=["fixed", "extendable"])
@pytest.mark.parametrize("make_adapter", waiting_backends(default=""), indirect=True)
async def test_nothing_inside_a_sandbox_extends_its_life(make_adapter, max_extension, request) -> None:
    """Nor shortens it, where the timer outlives its sleep: a command may kill any process it
    sees (a TTL of a few seconds: the signals must land well before it, on a loaded machine
    too)."""
    ttl, _, _, slack, survives = timing(request)
    ttl = max(ttl, 4.0)
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=ttl, max_extension=max_extension))
    expires = time.time() + ttl
    try:
        tried = await box.exec(FROM_INSIDE, timeout=10)
        if survives:  # the timer shrugged it off: what follows is not an early end
            assert tried.exit_code == 0, tried.error_text
        gone = await lost_at(box, expires + slack)
        assert gone <= expires + slack, "the sandbox outlived its TTL after what its commands did"
    finally:
        await box.close()


async def test_extend_ttl_refuses_bad_seconds_and_a_closed_sandbox(make_adapter) -> None:
    adapter = make_adapter()
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    for bad in (0, -1, float("inf")):
        with pytest.raises(oa.ConfigError, match="positive, finite"):
            await box.extend_ttl(bad)  # type: ignore[attr-defined]
    with pytest.raises(TTLCapExceeded, match="max_extension=0"):
        await box.extend_ttl(1)  # type: ignore[attr-defined]
    await box.close()
    with pytest.raises(oa.SandboxLost):
        await box.extend_ttl(1)  # type: ignore[attr-defined]

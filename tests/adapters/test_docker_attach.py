"""``DockerAdapter.attach``: a controller takes over a sandbox another one made with a
reattach grace once that one is gone, and never one that is still someone's."""

from __future__ import annotations

import time

import pytest

import orchard_async as oa
from orchard_async.kit import labels as names
from orchard_async.kit.container_reattach import attach_check_command, parse_attach_check
from orchard_async.kit.container_shell import is_abandoned, relay_command
from tests.adapters.test_docker import containers, docker_cli, docker_daemon, eventually, make_adapter  # noqa: F401 - fixtures

SPEC = oa.SandboxSpec(ttl=300)


def abandon(adapter, sandbox) -> None:
    """What a controller's death does to its sandbox, in-process: its shell's stream closes
    and it forgets the sandbox (no removal)."""
    adapter._heartbeat.discard(sandbox.id)
    adapter._live.pop(sandbox.id)


async def test_attach_takes_over_a_sandbox_whose_controller_went(make_adapter) -> None:  # noqa: F811
    first, second = make_adapter(reattach_grace=60), make_adapter(reattach_grace=60)
    box = await first.create(SPEC)
    await box.exec("echo kept > f; sleep 1000 >/dev/null 2>&1 &")
    abandon(first, box)
    await box._client.close()
    taken = await second.attach(box.id)
    assert (await taken.exec("cat f")).stdout == b"kept\n"
    # the old session's processes are gone (its background sleep too): nothing writes on
    assert b"sleep 1000" not in (await taken.exec("ps -o args")).stdout
    assert taken.workdir == box.workdir and int(taken.expires_at) == int(box.expires_at)
    assert taken.labels[names.RUN] == first.run_id
    assert (await taken.exec("echo again")).stdout == b"again\n"
    await taken.close()
    assert await containers(first.run_id) == []


async def test_a_late_relay_of_the_old_session_never_takes_the_new_sessions_output(make_adapter) -> None:  # noqa: F811
    """A controller killed while it started its output relays can leave one starting after
    its session was ended (the daemon runs an exec whose client is gone): a ``cat`` on the old
    session's FIFO that no orphan pass killed. The next session's output must not go to it
    (seen as commands with an empty stderr after a service's ``kill -9``)."""
    first, second = make_adapter(reattach_grace=60), make_adapter(reattach_grace=60)
    box = await first.create(SPEC)
    old_pipes = box._client.output_pipes
    abandon(first, box)
    await box._client.close()

    async def ended() -> bool:
        out = await docker_cli("exec", box.id, *attach_check_command())
        return parse_attach_check(out.encode())[0] == "free"

    await eventually(ended, 20, "the old session's end")
    *_, script, name, directory, fifo = relay_command("e", old_pipes)
    await docker_cli("exec", "-d", box.id, "sh", "-c", script, name, directory, fifo)
    await eventually(lambda: _has_cat(box.id), 10, "the late relay's start")
    taken = await second.attach(box.id)
    try:
        for n in range(6):
            result = await taken.exec(f"echo out{n}; echo err{n} >&2")
            assert (result.stdout, result.stderr) == (f"out{n}\n".encode(), f"err{n}\n".encode())
    finally:
        await taken.close()


async def _has_cat(name: str) -> bool:
    return "cat" in await docker_cli("exec", name, "ps", "-o", "args")


async def test_attach_leaves_alone_a_sandbox_still_in_use(make_adapter) -> None:  # noqa: F811
    owner = make_adapter(reattach_grace=60, keepalive=1)
    box = await owner.create(SPEC)
    intruder = make_adapter(reattach_grace=60, keepalive=1)
    with pytest.raises(oa.CreateFailed, match="live shell session of another controller"):
        await intruder.attach(box.id)
    assert (await box.exec("echo still mine")).stdout == b"still mine\n"
    # one made without a grace ends with its controller: nothing to attach to, and left running
    plain = await make_adapter().create(SPEC)
    with pytest.raises(oa.SandboxLost, match="without a reattach grace"):
        await intruder.attach(plain.id)
    assert (await plain.exec("echo fine")).exit_code == 0
    with pytest.raises(oa.SandboxLost, match="is gone"):
        await intruder.attach("orchard-no-such-container")


def test_reap_leaves_a_sandbox_with_a_grace_to_end_itself() -> None:
    labels = {names.EXPIRES: str(int(time.time()) + 300)}
    dead = dict(ended=False, controller_alive=False, now=time.time(), older_than=0)
    assert is_abandoned(labels, **dead)
    assert not is_abandoned({**labels, names.REATTACH: "60"}, **dead)
    assert is_abandoned({**labels, names.REATTACH: "60"}, **{**dead, "ended": True})

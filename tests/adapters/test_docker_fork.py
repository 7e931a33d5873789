"""Docker forks against a real daemon: a sandbox's snapshot (a committed image) and sandboxes
started from it; identical at start, independent after; nothing left behind after close and
drop, nor after a SIGKILLed controller and ``reap``.

Skips without a daemon (fails in CI, like the other docker tests); containers and images are
found by this test's own run label, so other users of the daemon do not disturb it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import anyio
import msgspec
import pytest

import orchard_async as oa
from tests.adapters.test_docker import (  # noqa: F401 - the daemon check and make_adapter are fixtures
    IMAGE,
    REPO,
    containers,
    docker_cli,
    docker_daemon,
    eventually,
    make_adapter,
)

pytest.importorskip("aiodocker")  # test_docker skips (fails in CI) without it, and so does this module
from orchard_async.adapters.docker import DockerAdapter  # noqa: E402
from orchard_async.adapters.docker.fork import SNAPSHOT_LABEL  # noqa: E402

FORKS = 8

# What the source sandbox's setup leaves: a file in the work dir, one outside it, a deleted
# file of the image (a whiteout in the committed layer), a directory tree.
SETUP = "echo base >state.txt && mkdir -p tree/a && echo deep >tree/a/b && mkdir -p /opt && echo opt >/opt/outside && rm /bin/true"
# The file system as a fork sees it: every file's content, and whether the deleted one stays deleted.
VIEW = "cat state.txt tree/a/b /opt/outside; [ -e /bin/true ] && echo true-is-back || echo true-gone"
BASE_VIEW = "base\ndeep\nopt\ntrue-gone\n"


async def snapshot_images(run_id: str) -> list[str]:
    """Ids of every image (dangling or not) labelled with this run and as a snapshot."""
    out = await docker_cli(
        "images",
        "-a",
        "-q",
        "--no-trunc",
        "--filter",
        f"label=orchard.run={run_id}",
        "--filter",
        f"label={SNAPSHOT_LABEL}",
    )
    return sorted(set(out.split()))


async def image_exists(image: str) -> bool:
    done = await anyio.run_process(["docker", "image", "inspect", image], check=False)
    return done.returncode == 0


def forked(snapshot_id: str, ttl: float = 120) -> oa.SandboxSpec:
    return msgspec.structs.replace(oa.SandboxSpec(ttl=ttl), snapshot=snapshot_id)


async def test_forks_start_identical_and_stay_independent(make_adapter) -> None:  # noqa: F811 - the fixture
    adapter = make_adapter()
    source = await adapter.create(oa.SandboxSpec(ttl=120))
    assert (await source.exec(SETUP)).ok
    snapshot_id = await adapter.snapshot(source)
    # after the snapshot: no fork may see this
    assert (await source.exec("echo later >state.txt && echo later >/opt/late")).ok

    forks: list[oa.Sandbox] = []

    async def fork() -> None:
        forks.append(await adapter.create(forked(snapshot_id)))

    async with anyio.create_task_group() as group:
        for _ in range(FORKS):
            group.start_soon(fork)
    assert len({box.id for box in forks}) == FORKS
    for box in forks:
        assert (await box.exec(VIEW)).text == BASE_VIEW
        assert (await box.exec("[ -e /opt/late ] || echo no-late")).text == "no-late\n"

    # each writes its own mark in the same places; none sees another's, nor does the source
    async def mark(index: int, box: oa.Sandbox) -> None:
        assert (await box.exec(f"echo {index} >state.txt && echo {index} >>/opt/outside && touch only-{index}")).ok

    async with anyio.create_task_group() as group:
        for index, box in enumerate(forks):
            group.start_soon(mark, index, box)
    for index, box in enumerate(forks):
        view = await box.exec("cat state.txt /opt/outside; ls -d only-*")
        assert view.text == f"{index}\nopt\n{index}\nonly-{index}\n"
    assert (await source.exec("cat state.txt /opt/outside; ls -d only-* 2>/dev/null | wc -l")).text == (
        "later\nopt\n0\n"
    )
    # a fork of a fork's snapshot sees that fork's writes (forks are snapshots' sources too)
    second = await adapter.snapshot(forks[3])
    grandchild = await adapter.create(forked(second))
    assert (await grandchild.exec("cat state.txt")).text == "3\n"

    for box in [*forks, grandchild, source]:
        await box.close()
    await adapter.drop_snapshot(second)
    await adapter.drop_snapshot(snapshot_id)


async def test_close_and_drop_leave_no_image_or_layer(make_adapter) -> None:  # noqa: F811 - the fixture
    adapter = make_adapter()
    source = await adapter.create(oa.SandboxSpec(ttl=120))
    assert (await source.exec("head -c 100000 /dev/urandom >blob")).ok
    snapshot_id = await adapter.snapshot(source)
    layer_image = (await docker_cli("image", "inspect", "--format", "{{.Id}}", snapshot_id)).strip()
    assert await snapshot_images(adapter.run_id) == [layer_image]
    labels = json.loads(await docker_cli("image", "inspect", "--format", "{{json .Config.Labels}}", snapshot_id))
    assert labels["orchard.run"] == adapter.run_id and labels["orchard.controller"] == adapter.controller
    fork = await adapter.create(forked(snapshot_id))
    # the fork holds the image: dropping it now says so, and close() drops it once the fork is gone
    with pytest.raises(oa.ConfigError, match="close its forks first"):
        await adapter.drop_snapshot(snapshot_id)
    await fork.close()
    await source.close()
    await adapter.close()
    assert await containers(adapter.run_id) == []
    assert await snapshot_images(adapter.run_id) == []
    assert not await image_exists(layer_image)  # no untagged image (the layer) stays either
    await adapter.drop_snapshot(snapshot_id)  # idempotent, even after close
    with pytest.raises(oa.ConfigError, match="was dropped"):
        await adapter.create(forked(snapshot_id))


async def test_a_fork_whose_shell_never_attaches_ends_at_the_attach_grace(make_adapter) -> None:  # noqa: F811
    """The snapshot holds the source shell's pid file, the timer's sign that a shell attached:
    a fork must not inherit it, or a fork whose controller died before attaching would live
    to its TTL."""
    adapter = make_adapter(attach_grace=2)
    source = await adapter.create(oa.SandboxSpec(ttl=120))
    snapshot_id = await adapter.snapshot(source)
    await source.close()
    spec = forked(snapshot_id, ttl=300)
    name = f"orchard-{uuid.uuid4().hex[:16]}"
    config = adapter._container_config(spec, snapshot_id, adapter._labels(spec, time.time() + 300))
    _, relays, _ = await adapter._start_container(name, config)  # and no shell attaches

    async def gone() -> bool:
        return name not in await containers(adapter.run_id)

    await eventually(gone, 60, "the unattached fork ended at its attach grace, long before its TTL")
    if relays is not None:
        await relays.close()
    await adapter.drop_snapshot(snapshot_id)


async def test_a_snapshot_of_a_read_only_root_is_refused(make_adapter) -> None:  # noqa: F811 - the fixture
    adapter = make_adapter(read_only=True)
    box = await adapter.create(oa.SandboxSpec(ttl=60))
    with pytest.raises(oa.ConfigError, match="writable root"):
        await adapter.snapshot(box)
    await box.close()
    with pytest.raises(oa.ConfigError, match="not a docker snapshot id"):
        await adapter.create(forked("busybox:latest"))


CONTROLLER = textwrap.dedent(
    """
    import sys, anyio, msgspec
    import orchard_async as oa
    from orchard_async.adapters.docker import DockerAdapter

    async def main():
        adapter = DockerAdapter(image=sys.argv[2], run_id=sys.argv[3], exit_with_shell=False)
        source = await adapter.create(oa.SandboxSpec(ttl=600))
        await source.exec("echo setup >state.txt")
        snapshot_id = await adapter.snapshot(source)
        for _ in range(3):
            await adapter.create(msgspec.structs.replace(oa.SandboxSpec(ttl=600), snapshot=snapshot_id))
        open(sys.argv[1], "w").close()
        await anyio.sleep(3600)

    anyio.run(main)
    """
)


def start_controller(script: Path, ready: Path, run_id: str, stderr: Path) -> subprocess.Popen:
    argv = [sys.executable, str(script), str(ready), IMAGE, run_id]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr.open("wb"))


async def test_reap_removes_a_sigkilled_controllers_snapshot_and_forks(tmp_path: Path) -> None:
    run_id = f"t{uuid.uuid4().hex[:10]}"
    script, ready = tmp_path / "controller.py", tmp_path / "ready"
    script.write_text(CONTROLLER)
    process = start_controller(script, ready, run_id, tmp_path / "stderr")
    try:

        async def made_forks() -> bool:
            assert process.poll() is None, f"the controller died: {(tmp_path / 'stderr').read_text()}"
            return ready.exists()

        await eventually(made_forks, 90, "the controller made a snapshot and 3 forks")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    # exit_with_shell=False: the containers outlive the controller, as they would with a daemon
    # that kept the exec streams open; the snapshot image would stay forever
    assert len(await containers(run_id)) == 4
    assert len(await snapshot_images(run_id)) == 1
    reaper = DockerAdapter(image=IMAGE)
    try:
        removed = await reaper.reap()
    finally:
        await reaper.close()
    assert [name for name in removed if name.startswith("orchard/snapshot:")]
    assert await containers(run_id) == []
    assert await snapshot_images(run_id) == []

"""Forks (protocols.py, "Forks"): sandboxes started from one snapshot are identical at
start and independent after, and a snapshot and its forks leave nothing behind, after a
close and after a SIGKILLed controller plus ``reap``. Runs on every conformance backend
whose adapter has ``snapshot``; the others skip, naming why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import orchard_async as oa
from orchard_async.capabilities import Snapshots, facts_of
from tests.conformance.conftest import BACKENDS, adapter_name

FORKS = 8
# What a task's setup leaves: nested dirs, an executable, a file the forks will change.
SETUP = "mkdir -p repo/src && printf 'one\\n' > repo/src/a.txt && printf '#!/bin/sh\\necho hi\\n' > run.sh && chmod +x run.sh"
LISTING = 'find . -path ./.cache -prune -o -print | LC_ALL=C sort | while read -r p; do if [ -f "$p" ]; then printf \'%s %s \' "$p" "$(stat -c %a "$p")"; cat "$p"; else echo "$p/"; fi; done'


def requires_snapshot(adapter: oa.Adapter) -> None:
    if not isinstance(adapter, Snapshots):
        pytest.skip(f"the {adapter.name} adapter has no snapshot() (forks are optional: capabilities.Snapshots)")


def local_root(adapter: oa.Adapter) -> Path | None:
    host_dir = facts_of(adapter).host_dir
    return Path(host_dir) if host_dir and adapter.name == "local" else None


async def leftovers(adapter: oa.Adapter, ids: set[str]) -> list[str]:
    """What is left of these sandboxes and snapshots on the backend (local: dirs and mounts;
    docker: containers and images; kubernetes: pods, allow policies, the controller's
    snapshot dirs and the snapshot images in the node's containerd)."""
    if adapter.name == "kubernetes":
        return await kubernetes_leftovers(adapter, ids)
    return local_or_docker_leftovers(adapter, ids)


async def kubernetes_leftovers(adapter: Any, ids: set[str]) -> list[str]:
    from orchard_async.kit import labels as names

    api = adapter.api
    pods = await api.list_all(api.path("pods"), names.SANDBOX, "pods left by the fork test")
    left = [f"pod {pod['metadata']['name']}" for pod in pods if pod["metadata"]["name"] in ids]
    policies = await api.list_all(
        api.path("networkpolicies", group="networking.k8s.io/v1"), names.SANDBOX, "policies left by the fork test"
    )
    left += [f"policy {p['metadata']['name']}" for p in policies if p["metadata"]["labels"][names.SANDBOX] in ids]
    left += [f"snapshot dir {name}" for name in ids if (adapter.snapshot_dir / name).exists()]
    ctr = await adapter.forks.containerd()  # the containerd method's images
    if ctr is not None:
        from orchard_async.adapters.kubernetes.containerd_image import image_ref

        present = await anyio.to_thread.run_sync(ctr.images)
        left += [f"containerd image {image_ref(name)}" for name in ids if image_ref(name) in present]
    return left


def kubernetes_method(adapter: Any, snapshot: str) -> None:
    """Where the controller reaches the node's containerd (CONTAINERD_ADDRESS: the CI cluster),
    the kubernetes rows run the containerd method, not its tar fallback."""
    if adapter.name == "kubernetes" and os.environ.get("CONTAINERD_ADDRESS"):
        lease = json.loads((adapter.snapshot_dir / snapshot / "lease.json").read_text())
        assert lease["method"] == "containerd", f"containerd not used: {adapter.forks.why_not}"


def local_or_docker_leftovers(adapter: oa.Adapter, ids: set[str]) -> list[str]:
    if adapter.name == "docker":  # containers and snapshot images: `docker inspect` finds either
        return [
            name for name in ids if subprocess.run(["docker", "inspect", name], capture_output=True).returncode == 0
        ]
    root = local_root(adapter)
    if root is None:
        pytest.skip(f"no leftover check for the {adapter.name} adapter in this test yet")
    dirs = [name for name in ids if (root / name).exists()]
    mounts = [line for line in Path("/proc/mounts").read_text().splitlines() if str(root) in line]
    return dirs + mounts


@pytest.fixture
def local_options(make_adapter: Callable[..., oa.Adapter], tmp_path: Path, request: pytest.FixtureRequest) -> dict:
    """A root of the test's own for local backends (their leftovers are counted there)."""
    return {"root": tmp_path / "root"} if adapter_name(request.node.callspec.params["make_adapter"]) == "local" else {}


async def test_forks_start_identical_and_stay_independent(make_adapter, local_options) -> None:
    adapter = make_adapter(**local_options)
    requires_snapshot(adapter)
    base = await adapter.create(oa.SandboxSpec(ttl=300))
    assert (await base.exec(SETUP)).ok
    expected = (await base.exec(LISTING)).stdout
    assert b"repo/src/a.txt 644 one" in expected and b"run.sh 755" in expected
    snapshot = await adapter.snapshot(base)
    kubernetes_method(adapter, snapshot)
    # The base goes on after its snapshot, and what it writes now is in no fork.
    assert (await base.exec("echo base-later > repo/src/a.txt && echo x > base-only")).ok
    spec = msgspec.structs.replace(oa.SandboxSpec(ttl=300), snapshot=snapshot)
    forks = []
    try:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as group:

                async def fork() -> None:
                    forks.append(await adapter.create(spec))

                for _ in range(FORKS):
                    group.start_soon(fork)
        for box in forks:  # identical at start: the base as it was when snapshotted
            assert (await box.exec(LISTING)).stdout == expected
        for index, box in enumerate(forks):  # each writes, deletes, renames and adds
            script = f"echo fork-{index} > repo/src/a.txt && rm run.sh && mv repo moved && echo {index} > mine"
            result = await box.exec(script)
            assert result.ok, result.error_text
            assert (await box.exec("cat moved/src/a.txt mine")).stdout == (f"fork-{index}\n{index}\n".encode())
        for index, box in enumerate(forks):  # and sees no other fork's writes
            assert (await box.exec("cat moved/src/a.txt mine; ls")).stdout == (
                f"fork-{index}\n{index}\nmine\nmoved\n".encode()
            )
        later = await adapter.create(spec)  # a fork made after all those writes sees none of them
        forks.append(later)
        assert (await later.exec(LISTING)).stdout == expected
        # Written by the sandbox's own user, like a fresh sandbox's work dir.
        assert (await later.exec("touch new-file && mkdir new-dir && echo ok > repo/src/b.txt")).ok
    finally:
        for box in forks:
            await box.close()
        await base.close()
        await adapter.drop_snapshot(snapshot)


async def test_a_snapshot_and_its_forks_leave_nothing_after_close(make_adapter, local_options) -> None:
    adapter = make_adapter(**local_options)
    requires_snapshot(adapter)
    base = await adapter.create(oa.SandboxSpec(ttl=300))
    assert (await base.exec(SETUP)).ok
    snapshot = await adapter.snapshot(base)
    kubernetes_method(adapter, snapshot)
    forks = [await adapter.create(oa.SandboxSpec(ttl=300, snapshot=snapshot)) for _ in range(3)]
    for box in forks:
        assert (await box.exec("echo changed > repo/src/a.txt")).ok
    ids = {base.id, snapshot, *(box.id for box in forks)}
    for box in [base, *forks]:
        await box.close()
    await adapter.drop_snapshot(snapshot)
    await adapter.drop_snapshot(snapshot)  # idempotent
    assert await leftovers(adapter, ids) == []
    assert await adapter.list_owned() == []


CONTROLLER = textwrap.dedent(
    """
    import json, sys, anyio
    import orchard_async as oa

    async def main():
        adapter = oa.get_adapter(sys.argv[1], **json.loads(sys.argv[2]))
        base = await adapter.create(oa.SandboxSpec(ttl=600))
        await base.exec("mkdir -p repo && echo one > repo/a.txt")
        snapshot = await adapter.snapshot(base)
        forks = [await adapter.create(oa.SandboxSpec(ttl=600, snapshot=snapshot)) for _ in range(3)]
        for box in forks:
            await box.exec("echo two > repo/a.txt; sleep 300 >/dev/null 2>&1 &")
        print(json.dumps([base.id, snapshot, *(box.id for box in forks)]), flush=True)
        await anyio.sleep(3600)

    anyio.run(main)
    """
)


@pytest.mark.soak  # a controller process per backend (10-16 s on docker and kubernetes); close is checked in the default run
async def test_reap_removes_snapshots_and_forks_of_a_sigkilled_controller(make_adapter, local_options, request) -> None:
    adapter = make_adapter(**local_options)
    requires_snapshot(adapter)
    backend = request.node.callspec.params["make_adapter"]
    options = {**BACKENDS[backend], **{key: str(value) for key, value in local_options.items()}}
    controller = subprocess.Popen(  # noqa: ASYNC220 (a process to SIGKILL, not to await)
        [sys.executable, "-c", CONTROLLER, adapter_name(backend), json.dumps(options)],
        stdout=subprocess.PIPE,
        text=True,
    )
    frozen: list[int] = []
    try:
        assert controller.stdout is not None
        with anyio.fail_after(120):
            line = await anyio.to_thread.run_sync(controller.stdout.readline)
        listed = json.loads(line)
        ids, snapshot = set(listed), listed[1]
        assert len(ids) == 5
        if adapter.name == "local":
            # Freeze the sandboxes' own processes (their launchers unmount and remove their dirs
            # when they end): reap alone must clean up, as after a crash of the whole host side.
            from orchard_async.adapters.local import _sandbox_processes

            frozen = [pid for sdir, pids in _sandbox_processes().items() if Path(sdir).name in ids for pid in pids]
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait()
        reaper = make_adapter(**local_options)
        removed = set(await reaper.reap())
        # A snapshot never ends by itself: it is reap's to remove on every adapter. Sandboxes
        # are too where nothing else can end them (local, frozen above); a docker sandbox may
        # end on its own once its controller's shell is gone, before reap gets to it, and a
        # kubernetes pod's object may be deleted first by the dead controller's guardian
        # (adapters/kubernetes/guardian.py; reap skips a pod being deleted). Gone they must be.
        must_reap = ids if adapter.name == "local" else {snapshot}
        assert must_reap <= removed, f"reap left {sorted(must_reap - removed)}"
        assert await leftovers(reaper, ids) == []
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if controller.poll() is None:
            controller.kill()
            controller.wait()

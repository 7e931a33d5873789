"""The kubernetes adapter's snapshot store without a cluster: which snapshots ``reap`` removes
(adapters/kubernetes/snapshot.py) and what ``create`` says of an id it cannot use. The
snapshot and fork themselves run on a cluster: tests/conformance/test_fork.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import orchard_async as oa
from orchard_async import labels as names
from orchard_async.adapters.kubernetes import KubernetesAdapter
from orchard_async.adapters.kubernetes import snapshot as snaps
from orchard_async.errors import ConfigError
from tests.conftest import backend_missing, cluster_configured


def dead_identity() -> dict[str, str]:
    """The identity a controller that has exited had (on this host, in this PID namespace)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json; from orchard_async import labels; print(json.dumps(labels.controller_identity()))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def make(store: Path, name: str, identity: dict[str, str], expires_at: float) -> None:
    base = store / name
    base.mkdir(parents=True)
    labels = {names.EXPIRES: str(int(expires_at))}
    (base / "lease.json").write_text(json.dumps({"id": name, "labels": labels, "identity": identity}))
    (base / "tree.tar").write_bytes(b"\0" * 1024)


def test_reap_removes_snapshots_of_dead_controllers_and_expired_ones_only(tmp_path: Path) -> None:
    alive, dead, later = names.controller_identity(), dead_identity(), time.time() + 3600
    make(tmp_path, "ksnap-live", alive, later)
    make(tmp_path, "ksnap-dead", dead, later)
    make(tmp_path, "ksnap-expired", alive, time.time() - 10)
    make(tmp_path, "ksnap-kept", dead, later)  # this adapter's own (``keep``)
    (tmp_path / "ksnap-half-made").mkdir()  # a lease not yet written: young, left alone
    old = tmp_path / "ksnap-half-made-long-ago"
    old.mkdir()
    os.utime(old, (time.time() - 600, time.time() - 600))
    (tmp_path / "not-a-snapshot").mkdir()
    removed = snaps.reap(tmp_path, 0.0, keep={"ksnap-kept"})
    assert removed == ["ksnap-dead", "ksnap-expired", "ksnap-half-made-long-ago"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ksnap-half-made",
        "ksnap-kept",
        "ksnap-live",
        "not-a-snapshot",
    ]
    # ``older_than`` spares what expired less than that long ago
    make(tmp_path, "ksnap-just-expired", alive, time.time() - 10)
    assert snaps.reap(tmp_path, 60.0, keep={"ksnap-kept"}) == []


def test_a_dropped_or_foreign_snapshot_id_is_a_config_error(tmp_path: Path) -> None:
    make(tmp_path, "ksnap-present", names.controller_identity(), time.time() + 60)
    archive, lease = snaps.source(tmp_path, "ksnap-present")
    assert archive == tmp_path / "ksnap-present" / "tree.tar" and lease["id"] == "ksnap-present"
    snaps.drop(tmp_path, "ksnap-present")
    snaps.drop(tmp_path, "ksnap-present")  # idempotent
    with pytest.raises(ConfigError, match="does not exist"):
        snaps.source(tmp_path, "ksnap-present")
    for foreign in ("snap-0123", "../etc", "ksnap-a/../../x"):
        with pytest.raises(ConfigError, match="not a kubernetes snapshot id"):
            snaps.source(tmp_path, foreign)


# -- against a cluster --------------------------------------------------------------------------


async def test_a_fork_runs_its_bases_image_and_close_drops_the_runs_snapshots(tmp_path: Path) -> None:
    """A fork whose spec names no image runs the base's (not the adapter's default), and an
    adapter's close drops the snapshots its run did not (in ``snapshot_dir``, the option)."""
    if not cluster_configured():
        pytest.skip("no Kubernetes cluster configured (KUBECONFIG, ~/.kube/config or ORCHARD_K8S_TEST_CONTEXT)")
    base_image = os.environ.get("ORCHARD_K8S_IMAGE", "orchard/python:test")
    adapter = KubernetesAdapter(
        image="local/busybox:1",
        namespace=os.environ.get("ORCHARD_K8S_TEST_NAMESPACE", "orchard-test"),
        context=os.environ.get("ORCHARD_K8S_TEST_CONTEXT"),
        snapshot_dir=str(tmp_path / "snaps"),
    )
    try:
        try:
            await adapter.doctor()
        except oa.OrchardError as exc:
            backend_missing(f"kubernetes: {exc}")
        base = await adapter.create(oa.SandboxSpec(ttl=300, image=base_image))
        assert (await base.exec("echo kept > file")).ok
        if not (await base.exec("command -v python3")).ok:
            backend_missing(f"{base_image} has no python3: it cannot tell the base's image from busybox")
        snapshot = await adapter.snapshot(base)
        assert (tmp_path / "snaps" / snapshot / "tree.tar").is_file()
        fork = await adapter.create(oa.SandboxSpec(ttl=300, snapshot=snapshot))
        assert (await fork.exec("cat file")).stdout == b"kept\n"
        assert (await fork.exec("command -v python3")).ok, "the fork did not run its base's image"
    finally:
        await adapter.close()
    assert not (tmp_path / "snaps" / snapshot).exists()
    assert await adapter.list_owned() == []

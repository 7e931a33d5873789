"""The kubernetes adapter's snapshots (adapters/kubernetes/snapshot.py, containerd_image.py,
forks.py): without a cluster, which snapshots and snapshot images ``reap`` removes, what goes
into a containerd snapshot's layer, manifest and config, and what ``create`` says of an id it
cannot use; on a cluster, both methods (the containerd image import and the tar fallback)
against their own promises. tests/conformance/test_fork.py checks forks on every adapter."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

import orchard_async as oa
from orchard_async.adapters.kubernetes import KubernetesAdapter
from orchard_async.adapters.kubernetes import containerd_image as images
from orchard_async.adapters.kubernetes import containerd_layer as layers
from orchard_async.adapters.kubernetes import snapshot as snaps
from orchard_async.errors import ConfigError
from orchard_async.kit import labels as names
from tests.conftest import backend_missing, cluster_configured


def dead_identity() -> dict[str, str]:
    """The identity a controller that has exited had (on this host, in this PID namespace)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json; from orchard_async.kit import labels; print(json.dumps(labels.controller_identity()))",
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


def layer_of(entries: list[tuple[str, bytes | None]]) -> io.BytesIO:
    """A layer tar: (name, data) files, (name, None) dirs."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                layer.addfile(info)
            else:
                info.size, info.mode = len(data), 0o640
                layer.addfile(info, io.BytesIO(data))
    raw.seek(0)
    return raw


def test_a_snapshot_layer_keeps_the_tasks_writes_and_leaves_out_the_pods_own(tmp_path: Path) -> None:
    """What ``ctr snapshots diff`` gives (whiteouts as ``.wh.`` files) minus the shell
    protocol's control dir and the runtime's mount points, byte for byte otherwise."""
    source = layer_of(
        [
            ("opt/", None),
            ("opt/setup-done", b"yes\n"),
            ("workspace/repo/a.txt", b"one\n"),
            ("bin/.wh.vi", b""),
            ("tmp/", None),
            ("tmp/.orchard/", None),
            ("tmp/.orchard/shell.pid", b"42"),
            ("tmp/.orchard-not-ours", b"kept"),
            ("tmp/scratch", b"kept too"),
            ("etc/hosts", b""),
            ("etc/hostname", b""),
            ("etc/resolv.conf", b""),
            ("etc/hosts.allow", b"kept"),
            ("dev/termination-log", b""),
        ]
    )
    digest, size = layers.filtered_layer(source, tmp_path / "layer.tar")
    written = (tmp_path / "layer.tar").read_bytes()
    assert (digest, size) == (f"sha256:{hashlib.sha256(written).hexdigest()}", len(written))
    with tarfile.open(tmp_path / "layer.tar") as layer:
        kept = {member.name: (layer.extractfile(member).read() if member.isfile() else None) for member in layer}
        mode = layer.getmember("opt/setup-done").mode
    assert kept == {
        "opt": None,
        "opt/setup-done": b"yes\n",
        "workspace/repo/a.txt": b"one\n",
        "bin/.wh.vi": b"",
        "tmp": None,
        "tmp/.orchard-not-ours": b"kept",
        "tmp/scratch": b"kept too",
        "etc/hosts.allow": b"kept",
    }
    assert mode == 0o640


def test_an_overlay_upper_dir_becomes_an_oci_layer(tmp_path: Path) -> None:
    """overlayfs marks a deleted file with a 0/0 character device and a dir that replaced one
    below with ``trusted.overlay.opaque=y``: the layer has ``.wh.`` files for them instead."""
    if os.geteuid() != 0:
        pytest.skip("whiteouts (mknod) and trusted xattrs need root")
    upper = tmp_path / "upper"
    (upper / "bin").mkdir(parents=True)
    os.mknod(upper / "bin" / "vi", 0o600 | stat.S_IFCHR, os.makedev(0, 0))  # a deleted /bin/vi
    (upper / "srv" / "redone").mkdir(parents=True)
    try:
        os.setxattr(upper / "srv" / "redone", "trusted.overlay.opaque", b"y")
    except OSError as exc:
        pytest.skip(f"no trusted xattrs on {tmp_path}: {exc}")
    (upper / "srv" / "redone" / "new.txt").write_text("new\n")
    (upper / "opt").mkdir()
    (upper / "opt" / "tool").write_text("#!/bin/sh\n")
    (upper / "opt" / "tool").chmod(0o755)
    os.link(upper / "opt" / "tool", upper / "opt" / "tool-link")
    (upper / "tmp" / ".orchard").mkdir(parents=True)
    (upper / "tmp" / ".orchard" / "shell.pid").write_text("7")
    layers.upper_layer(str(upper), tmp_path / "layer.tar")
    with tarfile.open(tmp_path / "layer.tar") as layer:
        members = {member.name: member for member in layer}
        assert layer.extractfile(members["srv/redone/new.txt"]).read() == b"new\n"
    assert sorted(members) == [
        "bin",
        "bin/.wh.vi",
        "opt",
        "opt/tool",
        "opt/tool-link",
        "srv",
        "srv/redone",
        "srv/redone/.wh..wh..opq",
        "srv/redone/new.txt",
        "tmp",
    ]
    assert members["bin/.wh.vi"].isfile() and members["srv/redone/.wh..wh..opq"].isfile()
    first, second = sorted(("opt/tool", "opt/tool-link"), key=lambda name: members[name].islnk())
    assert members[first].mode == 0o755 and members[second].islnk() and members[second].linkname == first
    assert not any(key.startswith(layers.OVERLAY_XATTR) for m in members.values() for key in m.pax_headers)


def test_a_snapshot_image_is_its_base_plus_one_layer() -> None:
    manifest = {
        "schemaVersion": 2,
        "mediaType": images.DOCKER_MANIFEST,
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:c0", "size": 9},
        "layers": [
            {"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "digest": "sha256:l0", "size": 5}
        ],
    }
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:d0"]},
        "history": [{"created_by": "base"}],
    }
    new_manifest, new_config = images.extended(images.DOCKER_MANIFEST, manifest, config, ("sha256:new", 123), "a:1")
    made, built = json.loads(new_manifest), json.loads(new_config)
    assert made["layers"][:-1] == manifest["layers"]
    assert made["layers"][-1] == {"mediaType": images.DOCKER_LAYER_TAR, "digest": "sha256:new", "size": 123}
    assert made["config"]["digest"] == f"sha256:{hashlib.sha256(new_config).hexdigest()}"
    assert made["config"]["size"] == len(new_config) and made["mediaType"] == images.DOCKER_MANIFEST
    assert built["rootfs"]["diff_ids"] == ["sha256:d0", "sha256:new"]  # the uncompressed layer's digest
    assert built["config"] == config["config"] and built["architecture"] == "amd64"
    assert len(built["history"]) == 2 and "a:1" in built["history"][1]["created_by"]
    # two snapshots with the same layer still differ in config: the CRI names an image by it
    other = images.extended(images.DOCKER_MANIFEST, manifest, config, ("sha256:new", 123), "a:2")[1]
    assert hashlib.sha256(other).digest() != hashlib.sha256(new_config).digest()
    oci = json.loads(
        images.extended("application/vnd.oci.image.manifest.v1+json", manifest, config, ("sha256:n", 1))[0]
    )
    assert oci["layers"][-1]["mediaType"] == layers.LAYER_TAR


class FakeContainerd:
    """The images ``ctr images ls`` would list (name -> labels) and what was removed."""

    def __init__(self, found: dict[str, dict[str, str]]) -> None:
        self.found, self.removed = found, []

    def images(self) -> dict[str, dict[str, str]]:
        return dict(self.found)

    def remove(self, ref: str) -> None:
        self.removed.append(ref)
        self.found.pop(ref, None)


def test_reap_removes_snapshot_images_by_their_labels_and_dirs_with_their_images(tmp_path: Path) -> None:
    alive, dead, later = names.controller_identity(), dead_identity(), time.time() + 3600

    def labelled(name: str, identity: dict[str, str], expires_at: float) -> dict[str, str]:
        lease = {"id": name, "labels": {names.EXPIRES: str(int(expires_at))}, "identity": identity}
        labels = snaps.image_labels(lease)
        assert all("," not in value and " " not in value for value in labels.values())  # ctr ls prints them joined
        return {**labels, "io.cri-containerd.image": "managed"}

    ctr = FakeContainerd(
        {
            images.image_ref("ksnap-live"): labelled("ksnap-live", alive, later),
            images.image_ref("ksnap-dead"): labelled("ksnap-dead", dead, later),
            images.image_ref("ksnap-expired"): labelled("ksnap-expired", alive, time.time() - 10),
            images.image_ref("ksnap-kept"): labelled("ksnap-kept", dead, later),
            images.image_ref("ksnap-unlabelled"): {},  # imported, not yet labelled: its dir decides
        }
    )
    # a dead controller's snapshot dir naming its image (killed before the label went on)
    make(tmp_path, "ksnap-unlabelled", dead, later)
    lease = json.loads((tmp_path / "ksnap-unlabelled" / "lease.json").read_text())
    lease.update(method="containerd", fork_image=images.image_ref("ksnap-unlabelled"))
    (tmp_path / "ksnap-unlabelled" / "lease.json").write_text(json.dumps(lease))
    removed = snaps.reap(tmp_path, 0.0, keep={"ksnap-kept"}, ctr=ctr)
    assert removed == ["ksnap-dead", "ksnap-expired", "ksnap-unlabelled"]
    assert sorted(ctr.found) == [images.image_ref("ksnap-kept"), images.image_ref("ksnap-live")]
    assert not (tmp_path / "ksnap-unlabelled").exists()
    # without containerd, a dir whose image it cannot remove stays for a later reap
    make(tmp_path, "ksnap-dead-image", dead, later)
    lease["id"], lease["fork_image"] = "ksnap-dead-image", images.image_ref("ksnap-dead-image")
    (tmp_path / "ksnap-dead-image" / "lease.json").write_text(json.dumps(lease))
    assert snaps.reap(tmp_path, 0.0, keep=set(), ctr=None) == []
    assert (tmp_path / "ksnap-dead-image").exists()


def test_a_registry_or_a_forced_containerd_with_a_read_only_root_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="registry is not built"):
        KubernetesAdapter(snapshot_registry="registry.example:5000")
    with pytest.raises(ConfigError, match="read_only"):
        KubernetesAdapter(snapshot_method="containerd", read_only=True)
    with pytest.raises(ConfigError, match="bad option"):
        KubernetesAdapter(snapshot_method="registry")


async def test_without_containerd_forks_fall_back_to_the_tar_and_doctor_says_why(tmp_path: Path) -> None:
    adapter = KubernetesAdapter(containerd_address=str(tmp_path / "no.sock"), snapshot_dir=str(tmp_path))
    assert await adapter.forks.containerd() is None
    said = await adapter.forks.describe()
    assert "tar of the work dir" in said and f"no containerd socket at {tmp_path / 'no.sock'}" in said
    forced = KubernetesAdapter(containerd_address=str(tmp_path / "no.sock"), snapshot_method="containerd")
    with pytest.raises(ConfigError, match="snapshot_method='containerd' but no containerd socket"):
        await forced.forks.containerd()


# -- against a cluster --------------------------------------------------------------------------


def cluster_adapter(tmp_path: Path, **options: object) -> KubernetesAdapter:
    if not cluster_configured():
        pytest.skip("no Kubernetes cluster configured (KUBECONFIG, ~/.kube/config or ORCHARD_K8S_TEST_CONTEXT)")
    return KubernetesAdapter(
        image="local/busybox:1",
        namespace=os.environ.get("ORCHARD_K8S_TEST_NAMESPACE", "orchard-test"),
        context=os.environ.get("ORCHARD_K8S_TEST_CONTEXT"),
        snapshot_dir=str(tmp_path / "snaps"),
        **options,
    )


async def usable(adapter: KubernetesAdapter) -> None:
    try:
        await adapter.doctor()
    except oa.OrchardError as exc:
        backend_missing(f"kubernetes: {exc}")


async def test_the_tar_fallback_forks_the_work_dir_in_its_bases_image_and_close_drops_it(tmp_path: Path) -> None:
    """The tar method (``snapshot_method="tar"``, and where containerd is out of reach): a fork
    whose spec names no image runs the base's (not the adapter's default), gets the work dir
    and nothing outside it, and an adapter's close drops the snapshots its run did not (in
    ``snapshot_dir``, the option)."""
    base_image = os.environ.get("ORCHARD_K8S_IMAGE", "orchard/python:test")
    adapter = cluster_adapter(tmp_path, snapshot_method="tar")
    try:
        await usable(adapter)
        assert "tar of the work dir" in await adapter.doctor() and "snapshot_method='tar'" in await adapter.doctor()
        base = await adapter.create(oa.SandboxSpec(ttl=300, image=base_image))
        assert (await base.exec("echo kept > file && mkdir -p /opt && echo setup > /opt/outside")).ok
        if not (await base.exec("command -v python3")).ok:
            backend_missing(f"{base_image} has no python3: it cannot tell the base's image from busybox")
        snapshot = await adapter.snapshot(base)
        assert (tmp_path / "snaps" / snapshot / "tree.tar").is_file()
        fork = await adapter.create(oa.SandboxSpec(ttl=300, snapshot=snapshot))
        assert (await fork.exec("cat file")).stdout == b"kept\n"
        assert (await fork.exec("command -v python3")).ok, "the fork did not run its base's image"
        assert not (await fork.exec("test -e /opt/outside")).ok, "the tar method carried a file outside the work dir"
    finally:
        await adapter.close()
    assert not (tmp_path / "snaps" / snapshot).exists()
    assert await adapter.list_owned() == []


async def test_a_containerd_snapshot_carries_the_whole_file_system_and_leaves_no_image(tmp_path: Path) -> None:
    """The containerd method on a one-node cluster (the controller on the node, as root): the
    fork runs an image of the base's file system with its writes anywhere (``/opt``, a removed
    file), without the base's shell files; the image is labelled with the run's lease; close
    removes the image and its layer from containerd."""
    base_image = os.environ.get("ORCHARD_K8S_IMAGE", "orchard/python:test")
    adapter = cluster_adapter(tmp_path, snapshot_method="containerd")
    try:
        await usable(adapter)
        try:
            ctr = await adapter.forks.containerd()
        except ConfigError as exc:
            backend_missing(f"kubernetes: no containerd to import into: {exc}")
        assert ctr is not None and "containerd image import" in await adapter.doctor()
        base = await adapter.create(oa.SandboxSpec(ttl=300, image=base_image))
        # a file of the image to remove (Debian images have the first, busybox the second)
        found = await base.exec("for f in /etc/profile /bin/vi; do if [ -e $f ]; then echo $f; break; fi; done")
        image_file = found.stdout.decode().strip()
        assert image_file, f"{base_image} has neither /etc/profile nor /bin/vi"
        setup = f"echo kept > file && mkdir -p /opt && echo setup > /opt/outside && rm {image_file}"
        assert (await base.exec(setup + " && echo x > /tmp/.orchard/mine")).ok
        snapshot = await adapter.snapshot(base)
        lease = json.loads((tmp_path / "snaps" / snapshot / "lease.json").read_text())
        assert lease["method"] == "containerd" and not (tmp_path / "snaps" / snapshot / "tree.tar").exists()
        ref = images.image_ref(snapshot)
        labels = ctr.images()[ref]
        assert labels[names.RUN] == adapter.run_id and labels["orchard.snapshot"] == snapshot
        assert (await base.exec("echo later > file && rm /opt/outside")).ok  # after the snapshot: in no fork
        fork = await adapter.create(oa.SandboxSpec(ttl=300, snapshot=snapshot))
        listing = await fork.exec(f"cat file /opt/outside; test -e {image_file} || echo removed; ls /tmp/.orchard")
        assert listing.stdout.decode().split()[:3] == ["kept", "setup", "removed"], listing.stdout
        assert b"mine" not in listing.stdout and b"shell.pid" in listing.stdout  # its own shell's, not the base's
        pod = await adapter.api.request("GET", adapter.api.path("pods", fork.id), what="pod get")
        [container] = [c for c in pod["spec"]["containers"] if c["name"] == "sandbox"]  # beside the egress filter's
        assert container["imagePullPolicy"] == "Never" and container["image"] == ref
        manifest = images.manifest_of(ctr, ref)[1]
        layer = manifest["layers"][-1]["digest"]
    finally:
        await adapter.close()
    assert not (tmp_path / "snaps" / snapshot).exists()
    assert ref not in ctr.images()
    content = ctr.run("content", "ls", "-q").decode()
    assert layer not in content, "the snapshot's layer is still in containerd's content store"
    assert await adapter.list_owned() == []

"""A kubernetes sandbox's whole file system as an image in its node's containerd (snapshot.py's
first method), with ``ctr`` (containerd's own CLI) and tar: no registry, no hand-made layer
format.

Built as follows, on the node, by a controller that reaches the node's containerd socket
(root):

1. ``ctr containers info <id>`` of the pod's sandbox container names its snapshotter and the
   snapshot key of its root file system, and the image it runs.
2. The container's writes as an uncompressed OCI layer tar (containerd_layer.py): GNU tar of
   its overlay upper dir (``ctr snapshots mounts`` names it), else ``ctr snapshots diff``,
   through a filter that makes overlay whiteouts OCI ones and leaves out what belongs to the
   pod, not to the task: the shell protocol's control dir (``/tmp/.orchard``) and the mount
   points the runtime creates (``/etc/hosts``, ``/etc/hostname``, ``/etc/resolv.conf``,
   ``/dev/termination-log``).
3. The image's manifest and config (``ctr content get``) get the layer appended (the
   config's ``rootfs.diff_ids`` and history, the manifest's layers), and the three blobs go
   to ``ctr images import`` as a small OCI layout: the base's layers are in the content
   store already, so only the new layer is written and unpacked.
4. The image (``docker.io/orchard/ksnap:<hex>``) is labelled with the run's lease (owner,
   run, expiry, controller) for ``reap``; forks run it with pull policy ``Never``.

Removal is ``ctr images rm --sync`` of that name and of the second name the CRI plugin gives
every image (its config digest); containerd's garbage collector then drops the layer, and its
unpacked snapshot once no fork's container holds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

from orchard_async.adapters.kubernetes.containerd_layer import LAYER_TAR, Unavailable, container_layer

NAMESPACE = "k8s.io"  # the CRI plugin's containerd namespace: the kubelet sees only images there
REPO = "docker.io/orchard/ksnap"
DOCKER_LAYER_TAR = "application/vnd.docker.image.rootfs.diff.tar"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEXES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
DEFAULT_ADDRESS = "/run/containerd/containerd.sock"
CTR_TIMEOUT = 120.0  # seconds one small ctr call may take (a loaded node answers in well under one)
LABEL_PREFIX = "orchard."
NO_CTR = "no ctr on this host (containerd's CLI: apt-get install containerd)"


def address(configured: str | None) -> str:
    return configured or os.environ.get("CONTAINERD_ADDRESS") or DEFAULT_ADDRESS


def image_ref(snapshot_id: str) -> str:
    return f"{REPO}:{snapshot_id}"


class Ctr:
    """``ctr`` against one containerd socket in the CRI namespace. Blocking: run in a thread."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def argv(self, *args: str) -> list[str]:
        return ["ctr", "--address", self.socket, "--namespace", NAMESPACE, *args]

    def run(self, *args: str, stdin: bytes | None = None, timeout: float = CTR_TIMEOUT) -> bytes:
        try:
            done = subprocess.run(self.argv(*args), input=stdin, capture_output=True, timeout=timeout)
        except FileNotFoundError:
            raise Unavailable(NO_CTR) from None
        except subprocess.TimeoutExpired:
            raise Unavailable(f"ctr {args[0]} {args[1] if len(args) > 1 else ''} took over {timeout:.0f}s") from None
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            raise Unavailable(f"ctr {' '.join(args[:2])} failed: {said[-1] if said else done.returncode}")
        return done.stdout

    def probe(self) -> str:
        """containerd's version, or Unavailable saying why it cannot be reached."""
        if shutil.which("ctr") is None:
            raise Unavailable(NO_CTR)
        if not os.path.exists(self.socket):
            raise Unavailable(f"no containerd socket at {self.socket} (set containerd_address or CONTAINERD_ADDRESS)")
        if not os.access(self.socket, os.R_OK | os.W_OK):
            raise Unavailable(f"containerd's socket {self.socket} is not writable by this user (needs root)")
        version = ""
        for line in self.run("version", timeout=10).decode(errors="replace").splitlines():
            if line.strip().startswith("Version:") and "Server" not in line:
                version = line.split(":", 1)[1].strip()
        return f"containerd {version}" if version else "containerd"

    def container(self, container_id: str) -> dict[str, Any]:
        try:
            return json.loads(self.run("containers", "info", container_id))
        except Unavailable as exc:
            raise Unavailable(
                f"container {container_id[:12]} is not in the containerd at {self.socket} "
                f"(another node's, or another containerd): {exc}"
            ) from None

    def blob(self, digest: str) -> bytes:
        return self.run("content", "get", digest)

    def image_target(self, ref: str) -> tuple[str, str]:
        """(media type, digest) of an image's target."""
        lines = self.run("images", "ls", f"name=={ref}").decode().splitlines()[1:]
        for line in lines:
            fields = line.split()
            if len(fields) >= 3 and fields[0] == ref:
                return fields[1], fields[2]
        raise Unavailable(f"image {ref} is not in the containerd at {self.socket}")

    def images(self) -> dict[str, dict[str, str]]:
        """Snapshot images (``REPO:*``): name -> labels."""
        out = self.run("images", "ls", f"name~=^{REPO}:").decode(errors="replace").splitlines()[1:]
        found: dict[str, dict[str, str]] = {}
        for line in out:
            fields = line.split()
            if not fields or not fields[0].startswith(f"{REPO}:"):
                continue
            labels = dict(item.partition("=")[::2] for item in fields[-1].split(",")) if "=" in fields[-1] else {}
            found[fields[0]] = labels
        return found

    def remove(self, ref: str) -> None:
        """Remove a snapshot image; nothing when it is gone already. The CRI plugin names
        every image it sees a second time, by its config digest (its image id): that record
        goes first (a crash between the two leaves the name, which finds it again)."""
        try:
            config = manifest_of(self, ref)[1]["config"]["digest"]
        except Unavailable:
            config = None  # gone already (or unreadable: the name's removal below says which)
        for name in [config, ref] if config else [ref]:
            try:
                self.run("images", "rm", "--sync", name)
            except Unavailable as exc:
                if "not found" not in str(exc):
                    raise


def manifest_of(ctr: Ctr, ref: str) -> tuple[str, dict[str, Any]]:
    """The media type and manifest of ``ref`` for this host's platform (an index resolved)."""
    media_type, digest = ctr.image_target(ref)
    document = json.loads(ctr.blob(digest))
    if media_type in INDEXES or "manifests" in document:
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
        for entry in document["manifests"]:
            wanted = entry.get("platform") or {}
            if wanted.get("os", "linux") == "linux" and wanted.get("architecture", arch) == arch:
                return entry["mediaType"], json.loads(ctr.blob(entry["digest"]))
        raise Unavailable(f"image {ref} has no linux/{arch} manifest")
    return media_type, document


def extended(
    manifest_type: str, manifest: dict[str, Any], config: dict[str, Any], layer: tuple[str, int], ref: str = ""
) -> tuple[bytes, bytes]:
    """The base's manifest and config with ``layer`` (digest, size; uncompressed) on top; the
    history names ``ref``, so that no two snapshots share a config (the CRI's image id)."""
    digest, size = layer
    config = dict(config)
    rootfs = dict(config.get("rootfs") or {"type": "layers"})
    rootfs["diff_ids"] = [*rootfs.get("diff_ids", []), digest]
    config["rootfs"] = rootfs
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    config["history"] = [
        *config.get("history", []),
        {"created": now, "created_by": f"orchard-async snapshot {ref}".strip()},
    ]
    config["created"] = now
    config_bytes = json.dumps(config, separators=(",", ":")).encode()
    layer_type = DOCKER_LAYER_TAR if manifest_type == DOCKER_MANIFEST else LAYER_TAR
    new_manifest = dict(manifest)
    new_manifest["config"] = {
        **manifest["config"],
        "digest": f"sha256:{hashlib.sha256(config_bytes).hexdigest()}",
        "size": len(config_bytes),
    }
    new_manifest["layers"] = [*manifest["layers"], {"mediaType": layer_type, "digest": digest, "size": size}]
    return json.dumps(new_manifest, separators=(",", ":")).encode(), config_bytes


def oci_layout(target: Any, ref: str, manifest_type: str, manifest: bytes, config: bytes, layer: Path) -> None:
    """An OCI image layout tar for ``ctr images import``, written to the stream ``target``:
    the new blobs only."""
    manifest_digest = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": manifest_type,
                "digest": manifest_digest,
                "size": len(manifest),
                "annotations": {
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": ref.rpartition(":")[2],
                },
            }
        ],
    }
    with tarfile.open(fileobj=target, mode="w|") as out:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), int(time.time())
            out.addfile(info, _BytesReader(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index).encode())
        add(f"blobs/sha256/{manifest_digest.split(':')[1]}", manifest)
        add(f"blobs/sha256/{hashlib.sha256(config).hexdigest()}", config)
        layer_digest = json.loads(manifest)["layers"][-1]["digest"]
        out.add(layer, arcname=f"blobs/sha256/{layer_digest.split(':')[1]}", recursive=False)


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size < 0 else self.at + size
        chunk, self.at = self.data[self.at : end], min(end, len(self.data))
        return chunk


def build(ctr: Ctr, container_id: str, ref: str, labels: dict[str, str], scratch: Path) -> dict[str, Any]:
    """Import the container's file system as image ``ref`` labelled ``labels``; what was
    built (the base image, the layer's size, the steps' times). ``scratch`` is a dir of the
    caller's for the layer, emptied before this returns. Unavailable when containerd
    cannot be used for this container (nothing imported then)."""
    steps: dict[str, float] = {}
    started = time.perf_counter()

    def step(name: str) -> None:
        nonlocal started
        now = time.perf_counter()
        steps[name], started = round((now - started) * 1000, 1), now

    info = ctr.container(container_id)
    base = info.get("Image") or ""
    if not base or not info.get("SnapshotKey"):
        raise Unavailable(f"container {container_id[:12]} names no image or snapshot in containerd")
    manifest_type, manifest = manifest_of(ctr, base)
    config = json.loads(ctr.blob(manifest["config"]["digest"]))
    step("base_ms")
    layer_path = scratch / "layer.tar"
    try:
        layer = container_layer(ctr, info, layer_path)
        step("diff_ms")
        new_manifest, new_config = extended(manifest_type, manifest, config, layer, ref)
        # streamed into ctr: the layer is written once more, into the content store
        argv = ctr.argv("images", "import", "--snapshotter", info["Snapshotter"], "-")
        with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
            assert proc.stdin is not None and proc.stderr is not None
            try:
                with proc.stdin:
                    oci_layout(proc.stdin, ref, manifest_type, new_manifest, new_config, layer_path)
            except BrokenPipeError:
                pass  # ctr stopped reading: what it said is below
            said = proc.stderr.read().decode(errors="replace").strip()
        if proc.returncode != 0:
            raise Unavailable(f"ctr images import failed: {said.splitlines()[-1] if said else proc.returncode}")
        step("import_ms")
        try:
            ctr.run("images", "label", ref, *(f"{key}={value}" for key, value in labels.items()))
        except BaseException:
            ctr.remove(ref)
            raise
    finally:
        layer_path.unlink(missing_ok=True)
    step("label_ms")
    return {"base": base, "layer_bytes": layer[1], "snapshotter": info["Snapshotter"], **steps}

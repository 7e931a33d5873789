#!/usr/bin/env python3
"""Build image tarballs for ``ctr images import`` from files on this machine: no registry.

    k8s-images.py OUTDIR [--pause PATH] [--busybox PATH]
        OUTDIR/pause.tar    local/pause:3.2   the pod sandbox image (K8S_BIN/pause, static)
        OUTDIR/busybox.tar  local/busybox:1   static busybox with a symlink per applet, /tmp,
                                              /etc/passwd; what the sandboxes run in CI
    k8s-images.py --raw OUT.tar NAME:TAG ENTRYPOINT_JSON SRC:DEST [SRC:DEST ...]
        any single-layer image (SRC may be "->target" for a symlink)

The tarballs are docker-archive format (manifest.json + config + one layer), byte-stable
for the same inputs, so a rebuild is skipped when the output is already there. Only
Python's standard library is used.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

MTIME = 1577836800  # 2020-01-01: same inputs, same bytes


def _dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, MTIME
    tar.addfile(info)


def build_layer(entries: list[tuple[str, str]]) -> bytes:
    """entries: (source, destination); a source "->target" makes a symlink."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        dirs: set[str] = set()
        for src, dest in entries:
            dest = dest.lstrip("/")
            parts = dest.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    _dir(tar, d, 0o1777 if d == "tmp" else 0o755)
                    dirs.add(d)
            if src.startswith("->"):
                info = tarfile.TarInfo(dest)
                info.type, info.linkname, info.mtime = tarfile.SYMTYPE, src[2:], MTIME
                tar.addfile(info)
            elif src.startswith("="):  # inline file content
                data = src[1:].encode()
                info = tarfile.TarInfo(dest)
                info.size, info.mode, info.mtime = len(data), 0o644, MTIME
                tar.addfile(info, io.BytesIO(data))
            else:
                info = tar.gettarinfo(src, dest)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = MTIME
                with open(src, "rb") as fh:
                    tar.addfile(info, fh)
        for d in ("tmp", "proc", "sys", "dev", "etc"):
            if d not in dirs:
                _dir(tar, d, 0o1777 if d == "tmp" else 0o755)
    return layer.getvalue()


def write_image(out: str, ref: str, entrypoint: list[str], layer: bytes, cmd: list[str] | None = None) -> str:
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "2020-01-01T00:00:00Z",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "2020-01-01T00:00:00Z", "created_by": "scripts/k8s-images.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": ["layer/layer.tar"]}]).encode()
    tmp = out + ".tmp"
    with tarfile.open(tmp, "w") as tar:
        for name, data in (("layer/layer.tar", layer), (config_name, config_bytes), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), MTIME
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out)
    return diff_id


def busybox_entries(busybox: str) -> list[tuple[str, str]]:
    """Static busybox at /bin/busybox and a symlink per applet at its usual place."""
    try:
        listing = subprocess.run([busybox, "--list-full"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"k8s-images: {busybox} --list-full failed ({exc}); apt-get install busybox-static")
    if _is_dynamic(busybox):
        sys.exit(f"k8s-images: {busybox} is not statically linked; apt-get install busybox-static")
    entries = [(busybox, "/bin/busybox")]
    seen = {"bin/busybox"}
    for path in sorted(listing.split()):
        if "/" in path and path not in seen:
            seen.add(path)
            entries.append(("->/bin/busybox", "/" + path))
    entries.append(
        ("=root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n", "/etc/passwd")
    )
    entries.append(("=root:x:0:\nnogroup:x:65534:\n", "/etc/group"))
    return entries


def _is_dynamic(path: str) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    return b"/lib64/ld-linux" in head or b"/lib/ld-linux" in head


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--raw":
        if len(sys.argv) < 6:
            sys.exit(__doc__)
        out, ref, entry = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
        pairs = [tuple(spec.split(":", 1)) for spec in sys.argv[5:]]
        print(out, ref, write_image(out, ref, entry, build_layer(pairs)))  # type: ignore[arg-type]
        return
    parser = argparse.ArgumentParser(description="build local/pause:3.2 and local/busybox:1 tarballs")
    parser.add_argument("outdir")
    parser.add_argument(
        "--pause", default=os.path.join(os.environ.get("K8S_BIN", "/var/cache/k8s-from-debian/bin"), "pause")
    )
    parser.add_argument("--busybox", default="/bin/busybox")
    args = parser.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    if not os.access(args.pause, os.X_OK):
        sys.exit(f"k8s-images: no pause binary at {args.pause} (scripts/k8s-build.sh builds it)")
    pause = os.path.join(args.outdir, "pause.tar")
    print(
        pause,
        "local/pause:3.2",
        write_image(pause, "local/pause:3.2", ["/pause"], build_layer([(args.pause, "/pause")])),
    )
    busybox = os.path.join(args.outdir, "busybox.tar")
    layer = build_layer(busybox_entries(args.busybox))
    print(busybox, "local/busybox:1", write_image(busybox, "local/busybox:1", [], layer, cmd=["/bin/sh"]))


if __name__ == "__main__":
    main()

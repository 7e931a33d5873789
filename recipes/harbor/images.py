"""A Harbor task's image on this machine, with no registry: its ``docker_image`` as named, or
its ``environment/Dockerfile`` built here (``orchard-async harbor build DIR``; Harbor's own
runner builds it through ``orchard_async.harbor`` the same way).

No registry is reachable, so every base (``FROM``, ``docker_image``) must already be a local
image. ``image_map`` (a recipe option) maps a name the task uses to one that is here
(``{"ubuntu:24.04": "orchard/bookworm:min"}``); an unmapped base that is not here is one
line naming it. A built image is tagged with a digest of the build context and the map, so
a task that changed gets a new image and an unchanged one is not built again.

The same Dockerfile also serves adapters that run no image (local): ``replay_plan`` reads
its ``WORKDIR``, ``ENV``, ``COPY``/``ADD`` and ``RUN`` lines, which the task replays in the
sandbox at setup (``FROM`` is the host's own tools there).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from orchard_async import ConfigError

BUILD_LABEL = "orchard.harbor.context"
MARKER = "/.orchard-harbor-image"  # in every image built here: its presence says the image ran
_FROM = re.compile(r"^(\s*FROM\s+)(?:--platform=\S+\s+)?(\S+)(.*)$", re.IGNORECASE)


def mapped(image: str, image_map: dict[str, str]) -> str:
    return image_map.get(image, image)


def dockerfile_bases(text: str) -> list[str]:
    """The images a Dockerfile builds FROM (its own stage names excluded)."""
    bases, stages = [], set()
    for line in text.splitlines():
        match = _FROM.match(line)
        if not match:
            continue
        image = match[2]
        if image.lower() not in stages:
            bases.append(image)
        alias = re.search(r"\s+AS\s+(\S+)", match[3], re.IGNORECASE)
        if alias:
            stages.add(alias[1].lower())
    return bases


def rewrite_bases(text: str, image_map: dict[str, str]) -> str:
    lines = []
    for line in text.splitlines():
        match = _FROM.match(line)
        lines.append(f"{match[1]}{mapped(match[2], image_map)}{match[3]}" if match else line)
    return "\n".join(lines) + "\n"


def context_digest(environment: Path, image_map: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in environment.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(environment)).encode() + b"\0" + path.read_bytes() + b"\0")
    used = {base: image_map[base] for base in dockerfile_bases(_dockerfile_text(environment)) if base in image_map}
    digest.update(repr(sorted(used.items())).encode())
    return digest.hexdigest()[:12]


def _dockerfile_text(environment: Path) -> str:
    path = environment / "Dockerfile"
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""


def built_tag(name: str, environment: Path, image_map: dict[str, str]) -> str:
    safe = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.") or "task"
    return f"orchard-harbor/{safe}:{context_digest(environment, image_map)}"


def docker_available() -> bool:
    return shutil.which("docker") is not None


def image_present(tag: str) -> bool:
    result = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, timeout=30, check=False)
    return result.returncode == 0


def missing_base(image: str, image_map: dict[str, str]) -> ConfigError:
    return ConfigError(
        f"base image {image!r} is not on this machine and no registry is reachable: map it to a local image "
        f'with --recipe-options \'{{"image_map": {{"{image}": "<local image>"}}}}\''
    )


def build(tag: str, environment: Path, image_map: dict[str, str], *, timeout: float = 600.0) -> bool:
    """Build ``environment/Dockerfile`` as ``tag`` unless it exists; True when it built.
    ``ConfigError`` for a base that is not here; ``RuntimeError`` (its last line) for a
    build that failed."""
    if image_present(tag):
        return False
    text = _dockerfile_text(environment)
    for base in dockerfile_bases(text):
        if base.lower() != "scratch" and not image_present(mapped(base, image_map)):
            raise missing_base(base, image_map)
    dockerfile = rewrite_bases(text, image_map) + f"RUN echo {shlex.quote(tag)} > {MARKER}\nLABEL {BUILD_LABEL}={tag}\n"
    # The classic builder: Debian's docker.io has no buildx, and none is needed for one file.
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    result = subprocess.run(
        ["docker", "build", "--force-rm", "-q", "-t", tag, "-f", "-", str(environment)],
        input=dockerfile.encode(),
        capture_output=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        lines = [line for line in result.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
        raise RuntimeError(f"docker build of {tag} failed: {lines[-1] if lines else 'no output'}")
    return True


def cluster_containerd() -> str:
    """The containerd of the local one-node cluster, where its pods find images (no registry);
    ConfigError when there is none here."""
    from orchard_async.images.build import containerd_address

    address = containerd_address()
    if address is None:
        raise ConfigError(
            "no containerd of a local one-node cluster here (CONTAINERD_ADDRESS, $ORCHARD_K8S_WORK or "
            "/run/containerd/containerd.sock): import the tasks' images on each node yourself"
        )
    return address


def containerd_refs(address: str) -> set[str]:
    """The image names the node's containerd (namespace k8s.io, the kubelet's) has."""
    result = subprocess.run(
        ["ctr", "--address", address, "-n", "k8s.io", "images", "ls", "-q"],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"ctr images ls at {address} failed: {_last_line(result.stderr)}")
    return set(result.stdout.decode().split())


def in_containerd(tag: str, refs: set[str]) -> bool:
    # `ctr import` of `docker save` names an image as docker does, fully qualified
    head = tag.split("/", 1)[0]
    if "/" not in tag:
        qualified = f"docker.io/library/{tag}"
    elif "." in head or ":" in head or head == "localhost":
        qualified = tag
    else:
        qualified = f"docker.io/{tag}"
    return tag in refs or qualified in refs


def import_into_containerd(tag: str, address: str, *, timeout: float = 600.0) -> bool:
    """Copy docker's image ``tag`` into the node's containerd, where a one-node cluster's
    pods find it (no registry), unless it is there; True when it imported."""
    if in_containerd(tag, containerd_refs(address)):
        return False
    with tempfile.TemporaryFile() as errors:
        save = subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE, stderr=errors)
        assert save.stdout is not None
        try:
            load = subprocess.run(
                ["ctr", "--address", address, "-n", "k8s.io", "images", "import", "-"],
                stdin=save.stdout, capture_output=True, timeout=timeout, check=False,
            )  # fmt: skip
        finally:
            save.stdout.close()
            save.wait(timeout=60)
        errors.seek(0)
        if save.returncode != 0:
            raise RuntimeError(f"docker save {tag} failed: {_last_line(errors.read())}")
    if load.returncode != 0:
        raise RuntimeError(f"ctr import of {tag} failed: {_last_line(load.stderr)}")
    return True


def _last_line(output: bytes) -> str:
    lines = [line for line in output.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


@dataclass
class ReplayPlan:
    """What a Dockerfile does that a sandbox without its image can do itself."""

    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    steps: list[tuple[str, str, str]] = field(default_factory=list)  # ("run", cmd, cwd) | ("copy", src, dest)
    user: str | None = None


def _joined_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    if current:
        lines.append(current)
    return lines


def replay_plan(environment: Path) -> ReplayPlan:
    """The Dockerfile's last stage as steps to replay in a sandbox (see the module docstring)."""
    plan = ReplayPlan()
    for line in _joined_lines(_dockerfile_text(environment)):
        word, _, rest = line.strip().partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "FROM":
            plan = ReplayPlan()  # a later stage starts over
        elif word == "WORKDIR":
            plan.workdir = rest if rest.startswith("/") else f"{(plan.workdir or '/').rstrip('/')}/{rest}"
            plan.steps.append(("run", f"mkdir -p {shlex.quote(plan.workdir)}", "/"))
        elif word == "ENV":
            if "=" in rest.split(" ", 1)[0]:
                for item in shlex.split(rest):
                    key, _, value = item.partition("=")
                    plan.env[key] = value
            else:
                key, _, value = rest.partition(" ")
                plan.env[key] = value.strip()
        elif word in ("COPY", "ADD"):
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            if len(parts) >= 2:
                for source in parts[:-1]:
                    plan.steps.append(("copy", source, parts[-1]))
        elif word == "RUN":
            if rest.startswith("["):
                import json

                rest = shlex.join(json.loads(rest))
            plan.steps.append(("run", rest, plan.workdir or "/"))
        elif word == "USER":
            plan.user = rest
    return plan

"""Sandbox images for the container adapters, built on this machine without a registry.

Recipes declare the images their sandboxes need as data, a module attribute
``IMAGES: list[ImageSpec]``; ``orchard-async images build`` builds them (every recipe's by
default, or the ones named), so a pip user needs nothing from the repository's scripts::

    orchard-async images build                              # every recipe's images
    orchard-async images build orchard/busybox:test         # by tag (the test images too)
    orchard-async images build --adapter kubernetes         # also into the local node's containerd

How, with no registry reachable (only the apt mirror this machine is configured with):

* ``base="busybox"``: the host's static busybox (Debian: ``busybox-static``) with a symlink
  per applet, ``docker import``.
* ``base="debian-minbase"``: ``debootstrap --variant=minbase SUITE`` from the machine's
  apt mirror, ``docker import`` as ``orchard/SUITE:min`` (shared by every such image);
  then the spec's ``apt_packages`` with ``docker build`` (apt inside the build reaches the
  mirror through Docker's default bridge), or, if that fails, apt-get in a chroot of an
  exported copy of the base and ``docker import``.

Every image carries a label with a digest of its spec: an image that exists with the same
digest is skipped (a second run takes about a second), one whose spec changed is rebuilt,
``force=True`` rebuilds the named images and their base. Building needs the docker CLI and
a daemon; a base image needs root (debootstrap, chroot). Work files and logs go to
``$ORCHARD_IMAGE_STATE`` (default ``/var/tmp/orchard-images``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import msgspec

from orchard_async.errors import ConfigError
from orchard_async.images import wheels as image_wheels

SPEC_LABEL = "orchard.image.spec"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DOCKER_TIMEOUT = 30.0  # inspect, tag, rm: quick daemon calls
BUILD_TIMEOUT = 1800.0  # debootstrap, apt, import: minutes on a slow mirror


class ImageSpec(msgspec.Struct, frozen=True):
    """One image a recipe's sandboxes run. ``tag`` is what the sandbox spec names;
    ``base`` what it is made from; ``apt_packages`` installed on a Debian base;
    ``suite`` the Debian release of that base; ``check`` a shell command that must succeed
    in the built image (default: the packages are installed)."""

    tag: str
    base: Literal["busybox", "debian-minbase"]
    apt_packages: tuple[str, ...] = ()
    suite: str = "bookworm"
    check: str = ""
    pip_packages: tuple[str, ...] = ()  # wheels the host downloads, installed with python3-pip (image_wheels)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_.-]+)?", self.tag or ""):
            raise ConfigError(f"image tag {self.tag!r} is not a valid lower-case repository[:tag]")
        if self.base not in ("busybox", "debian-minbase"):
            raise ConfigError(f"image base must be 'busybox' or 'debian-minbase', got {self.base!r}")
        if self.apt_packages and self.base != "debian-minbase":
            raise ConfigError(f"{self.tag}: apt_packages need base='debian-minbase' (busybox has no apt)")
        for package in self.apt_packages:
            if not re.fullmatch(r"[a-z0-9][a-z0-9+.-]*", package):
                raise ConfigError(f"{self.tag}: {package!r} is not a Debian package name")
        if self.pip_packages and "python3-pip" not in self.apt_packages:
            raise ConfigError(f"{self.tag}: pip_packages need 'python3-pip' among the apt_packages")
        if not re.fullmatch(r"[a-z]+", self.suite):
            raise ConfigError(f"{self.tag}: suite {self.suite!r} is not a Debian release name")

    @property
    def base_tag(self) -> str | None:
        """The intermediate image this one is built from (None: built from files)."""
        return f"orchard/{self.suite}:min" if self.base == "debian-minbase" and self.apt_packages else None

    @property
    def digest(self) -> str:
        fields = msgspec.to_builtins(self)
        if not self.pip_packages:  # specs without pip keep the digest they had before the field existed
            del fields["pip_packages"]
        return hashlib.sha256(msgspec.json.encode(fields)).hexdigest()[:16]


BUSYBOX_APPLETS_CHECK = (
    "for a in sh base64 head tail wc sleep kill cat mkdir rm ls stat printf env timeout find dd; do "
    'command -v "$a" >/dev/null || { echo "missing $a"; exit 1; }; done; '
    '[ "$(printf "a\\nb\\nc\\n" | head -n 2 | tail -n 1)" = b ] && [ "$(printf hi | base64 | base64 -d)" = hi ]'
)
PYTHON_CHECK = (
    'python3 -c "import sys; assert sys.version_info >= (3, 11)" && python3 -m pytest --version >/dev/null '
    "&& git --version >/dev/null && patch --version >/dev/null"
)

# The images the project's own tests run (tests/adapters, tests/conformance, CI).
TEST_IMAGES = [
    ImageSpec(tag="orchard/busybox:test", base="busybox", check=BUSYBOX_APPLETS_CHECK),
    ImageSpec(
        tag="orchard/python:test",
        base="debian-minbase",
        apt_packages=("python3", "python3-pytest", "git", "patch"),
        check=PYTHON_CHECK,
    ),
]


# What the adapters themselves run beside a sandbox: the kubernetes adapter's egress filter
# (adapters/kubernetes/egress.py), iptables in the pod's network namespace. Built with --test.
EGRESS_IMAGE = "orchard/egress:bookworm"
ADAPTER_IMAGES = [
    ImageSpec(
        tag=EGRESS_IMAGE,
        base="debian-minbase",
        apt_packages=("iptables",),
        check="iptables-restore --version && ip6tables-restore --version",
    ),
]


class ImageMissing(ConfigError):
    """A sandbox image is not where the adapter runs it; the message names the command that
    builds it. A ConfigError: retrying cannot help until the user acts."""


class ImageBuildError(Exception):
    """One step of a build failed; the message is the one line the user sees."""


def recipe_images() -> list[ImageSpec]:
    """Every image the installed recipes declare (their ``IMAGES``), in order, without repeats."""
    from orchard_async.runtime import load_recipe, recipe_names  # the recipes' entry points, read only when asked

    images: list[ImageSpec] = []
    for name in recipe_names():
        for spec in getattr(load_recipe(name), "IMAGES", []):
            if not isinstance(spec, ImageSpec):
                raise ConfigError(f"the {name} recipe's IMAGES must hold ImageSpec values, got {type(spec).__name__}")
            if spec.tag not in {known.tag for known in images}:
                images.append(spec)
    return images


def known_images() -> dict[str, ImageSpec]:
    """Every image ``images build`` can make, by tag: the recipes', the test images, the
    adapters' own and the Debian bases they are built from."""
    known = {spec.tag: spec for spec in [*recipe_images(), *TEST_IMAGES, *ADAPTER_IMAGES]}
    for spec in list(known.values()):
        if spec.base_tag and spec.base_tag not in known:
            known[spec.base_tag] = ImageSpec(tag=spec.base_tag, base="debian-minbase", suite=spec.suite)
    return known


def build_command(tag: str, adapter: str = "docker") -> str | None:
    """The command that builds ``tag`` for ``adapter``, or None when ``images build`` does
    not know the image (then no registry has it either: it is never pulled)."""
    try:
        known = known_images()
    except Exception:  # noqa: BLE001 - a broken recipe must not hide the adapter's own error
        return None
    if tag not in known:
        return None
    recipe_tags = {spec.tag for spec in recipe_images()}
    command = "orchard-async images build" if tag in recipe_tags else f"orchard-async images build {tag}"
    return command if adapter == "docker" else f"{command} --adapter {adapter}"


def missing_image_hint(tag: str, where: str, adapter: str = "docker") -> str:
    """What a user does about an image that is not on ``where`` (one clause)."""
    command = build_command(tag, adapter)
    if command:
        return f"build it with `{command}`"
    if adapter == "kubernetes":
        return f"push it to a registry the cluster pulls from, or import it into {where}'s containerd"
    return f"pull or load it into {where} yourself (`docker pull`, `docker load`), or name an image that is there"


# -- building ----------------------------------------------------------------------------------


def _say(message: str) -> None:
    print(f"images: {message}", flush=True)


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    """One progress line per step, with its seconds, printed when it ends."""
    started = time.monotonic()
    yield
    _say(f"{what}: {time.monotonic() - started:.1f} s")


def _run(argv: list[str], what: str, *, timeout: float = DOCKER_TIMEOUT, log: Path | None = None, **kw) -> str:
    """Run a command; its stdout, or ImageBuildError naming ``what`` and the log."""
    try:
        if log is not None:
            with log.open("ab") as sink:
                done = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout, check=False, **kw)
            output = ""
        else:
            done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False, **kw)
            output = done.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired:
        raise ImageBuildError(f"{what} did not finish within {timeout:.0f} s") from None
    except OSError as exc:
        raise ImageBuildError(f"{what} could not run: {exc}") from None
    if done.returncode != 0:
        where = f" (log {log})" if log else ""
        detail = _last_line(log.read_text(errors="replace") if log else done.stderr.decode(errors="replace"))
        raise ImageBuildError(f"{what} failed with exit code {done.returncode}{where}: {detail}")
    return output


def _pipe(producer: list[str], consumer: list[str], what: str, *, log: Path, timeout: float = BUILD_TIMEOUT) -> None:
    """``producer | consumer`` (tar | docker import), both checked."""
    with log.open("ab") as sink:
        first = subprocess.Popen(producer, stdout=subprocess.PIPE, stderr=sink)
        try:
            second = subprocess.run(
                consumer, stdin=first.stdout, stdout=sink, stderr=sink, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            first.kill()
            raise ImageBuildError(f"{what} did not finish within {timeout:.0f} s (log {log})") from None
        finally:
            assert first.stdout is not None
            first.stdout.close()
            first.wait()
    if first.returncode != 0 or second.returncode != 0:
        detail = _last_line(log.read_text(errors="replace"))
        raise ImageBuildError(f"{what} failed (log {log}): {detail}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


class Builder:
    """Builds ImageSpecs with the docker CLI. Prerequisites are checked per image, right
    before they are needed, so what is already built never asks for debootstrap or root."""

    def __init__(self, *, force: bool, state: Path):
        self.force = force
        self.state = state
        self.built: set[str] = set()  # tags made or found up to date in this run

    # docker helpers

    def _docker(self, *args: str, what: str, timeout: float = DOCKER_TIMEOUT, **kw) -> str:
        return _run(["docker", *args], what, timeout=timeout, **kw)

    @staticmethod
    def _inspect(tag: str, template: str) -> str | None:
        """One field of an image (a Go template), or None when there is no such image."""
        try:
            done = subprocess.run(
                ["docker", "image", "inspect", "-f", template, tag], capture_output=True, timeout=DOCKER_TIMEOUT
            )
        except subprocess.TimeoutExpired:
            raise ImageBuildError(
                f"the Docker daemon did not answer an inspect of {tag} within {DOCKER_TIMEOUT:.0f} s"
            ) from None
        return done.stdout.decode().strip() if done.returncode == 0 else None

    def image_label(self, tag: str) -> str | None:
        """The spec digest of an existing image ("" without one), or None when it is absent."""
        label = self._inspect(tag, f'{{{{index .Config.Labels "{SPEC_LABEL}"}}}}')
        return "" if label == "<no value>" else label

    def image_id(self, tag: str) -> str | None:
        return self._inspect(tag, "{{.Id}}")

    def _drop_replaced(self, old_id: str | None, tag: str) -> None:
        """A rebuild leaves the old image untagged: remove it unless a container uses it."""
        if old_id and old_id != self.image_id(tag):
            subprocess.run(["docker", "rmi", old_id], capture_output=True, timeout=DOCKER_TIMEOUT, check=False)

    def _size(self, tag: str) -> str:
        try:
            return f"{int(self._inspect(tag, '{{.Size}}') or '') / 1e6:.0f} MB"
        except ValueError:
            return "? MB"

    # the plan

    def build(self, spec: ImageSpec) -> None:
        if spec.tag in self.built:
            return
        if spec.base_tag:
            self.build(ImageSpec(tag=spec.base_tag, base="debian-minbase", suite=spec.suite))
        label = self.image_label(spec.tag)
        if label == spec.digest and not self.force:
            _say(f"{spec.tag} is up to date, skipped")
            self.built.add(spec.tag)
            return
        if label is None:
            why = "missing"
        elif label == spec.digest:
            why = "forced"
        else:
            why = "its spec changed" if label else "it has no spec label: built by something else"
        started = time.monotonic()
        old_id = self.image_id(spec.tag)
        _say(f"building {spec.tag} ({why})")
        if spec.base == "busybox":
            self._busybox(spec)
        elif spec.base_tag is None:
            self._minbase(spec)
        else:
            self._packages(spec, spec.base_tag)
        with _step(f"{spec.tag}: smoke test"):
            self._check(spec)
        self._drop_replaced(old_id, spec.tag)
        _say(f"{spec.tag} ready in {time.monotonic() - started:.1f} s ({self._size(spec.tag)})")
        self.built.add(spec.tag)

    def _check(self, spec: ImageSpec) -> None:
        check = spec.check or (
            f"dpkg-query -W {' '.join(spec.apt_packages)} >/dev/null" if spec.apt_packages else "true"
        )
        self._docker(
            "run", "--rm", "--network", "none", spec.tag, "sh", "-ec", check,
            what=f"the smoke test of {spec.tag} ({check})", timeout=120,
        )  # fmt: skip

    def _import(self, root: Path, spec: ImageSpec, cmd: str, log: Path, excludes: tuple[str, ...] = ()) -> None:
        changes = ["-c", f"CMD {cmd}", "-c", f"LABEL {SPEC_LABEL}={spec.digest}"]
        if spec.base == "busybox":
            changes += ["-c", "ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
        tar = ["tar", "-C", str(root), "--numeric-owner", *(f"--exclude={pattern}" for pattern in excludes), "-c", "."]
        _pipe(tar, ["docker", "import", *changes, "-", spec.tag], f"docker import of {spec.tag}", log=log)

    # busybox

    def _busybox(self, spec: ImageSpec) -> None:
        busybox = shutil.which("busybox") or "/bin/busybox"
        if not (os.access(busybox, os.X_OK) and _is_static_elf(busybox)):
            raise ImageBuildError(f"{spec.tag} needs a static busybox at /bin/busybox: apt-get install busybox-static")
        log = self.state / "busybox.log"
        with _tree(self.state / "rootfs-busybox") as root, _step(f"{spec.tag}: root file system and docker import"):
            for folder in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "root", "tmp", "var/tmp"):
                (root / folder).mkdir(parents=True, exist_ok=True)
            for folder in ("tmp", "var/tmp"):
                (root / folder).chmod(0o1777)
            shutil.copy2(busybox, root / "bin/busybox")
            applets = _run([busybox, "--list-full"], "busybox --list-full").split()
            for applet in applets:  # one symlink per applet at its usual place
                target = root / applet
                if "/" in applet and applet != "bin/busybox" and not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.symlink_to("/bin/busybox")
            (root / "etc/passwd").write_text(
                "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
            )
            (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
            self._import(root, spec, '["/bin/sh"]', log)

    # Debian minbase

    def _minbase(self, spec: ImageSpec) -> None:
        debootstrap = shutil.which("debootstrap") or next(
            (path for path in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.access(path, os.X_OK)), None
        )
        if debootstrap is None:
            raise ImageBuildError(f"{spec.tag} needs debootstrap: apt-get install debootstrap")
        if os.geteuid() != 0:
            raise ImageBuildError(f"{spec.tag} is built with debootstrap, which needs root: run this as root (sudo)")
        mirror = apt_mirror(spec.suite)
        log = self.state / f"debootstrap-{spec.suite}.log"
        log.write_text("")
        with _tree(self.state / f"rootfs-{spec.suite}-min") as root:
            with _step(f"{spec.tag}: debootstrap --variant=minbase {spec.suite} from {mirror}"):
                _run(
                    [debootstrap, "--variant=minbase", spec.suite, str(root), mirror],
                    f"debootstrap {spec.suite}", timeout=BUILD_TIMEOUT, log=log,
                )  # fmt: skip
            with _step(f"{spec.tag}: docker import"):
                excludes = ("./var/cache/apt/archives/*.deb", "./var/lib/apt/lists/*", "./proc/*", "./sys/*", "./dev/*")
                self._import(root, spec, '["/bin/bash"]', log, excludes)

    # packages on a Debian base

    def _packages(self, spec: ImageSpec, base: str) -> None:
        apt = "-o Acquire::http::Timeout=20 -o Acquire::Retries=2"
        packages = " ".join(spec.apt_packages)
        dockerfile = (
            f"FROM {base}\n"
            f"RUN apt-get {apt} update && DEBIAN_FRONTEND=noninteractive apt-get {apt} install -y "
            f"--no-install-recommends {packages} && apt-get clean && rm -rf /var/lib/apt/lists/*\n"
            + (image_wheels.dockerfile_lines(spec.pip_packages) if spec.pip_packages else "")
            + f"LABEL {SPEC_LABEL}={spec.digest}\n"
            'CMD ["/bin/bash"]\n'
        )
        log = self.state / f"build-{_safe(spec.tag)}.log"
        log.write_text("")
        env = {**os.environ, "DOCKER_BUILDKIT": "0"}  # Debian's docker.io has no buildx; one RUN needs none
        with contextlib.ExitStack() as stack:
            context = "-"  # no files: the Dockerfile is the whole context
            if spec.pip_packages:
                context = str(stack.enter_context(_tree(self.state / f"context-{_safe(spec.tag)}")))
                with _step(f"{spec.tag}: pip download {' '.join(spec.pip_packages)}"):
                    try:
                        image_wheels.download(spec.pip_packages, spec.suite, Path(context) / "wheels", log=log)
                    except image_wheels.WheelDownloadFailed as exc:
                        raise ImageBuildError(f"{spec.tag}: {exc}") from None
            try:
                with _step(f"{spec.tag}: docker build (apt-get install {packages})"):
                    _run(
                        ["docker", "build", "--force-rm", "-t", spec.tag, *(["-f", "-"] if context != "-" else []),
                         context], f"docker build of {spec.tag}",
                        timeout=BUILD_TIMEOUT, log=log, input=dockerfile.encode(), env=env,
                    )  # fmt: skip
                return
            except ImageBuildError as exc:
                if os.geteuid() != 0 or spec.pip_packages:  # the chroot path installs apt packages only
                    raise
                _say(f"{exc}; trying apt-get in a chroot instead")
        self._packages_in_chroot(spec, base, packages)

    def _packages_in_chroot(self, spec: ImageSpec, base: str, packages: str) -> None:
        """When apt cannot reach the mirror from a build container (no bridge networking):
        apt-get in a chroot of an exported copy of the base, on the host's network."""
        log = self.state / f"chroot-{_safe(spec.tag)}.log"
        log.write_text("")
        with _tree(self.state / f"rootfs-{_safe(spec.tag)}") as root, _step(f"{spec.tag}: apt-get in a chroot"):
            container = self._docker("create", base, "/bin/true", what=f"docker create from {base}").strip()
            try:
                _pipe(["docker", "export", container], ["tar", "-C", str(root), "-x"], f"export of {base}", log=log)
            finally:
                subprocess.run(["docker", "rm", container], capture_output=True, timeout=DOCKER_TIMEOUT, check=False)
            (root / ".dockerenv").unlink(missing_ok=True)
            shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
            shutil.copy("/etc/hosts", root / "etc/hosts")
            _run(["mount", "-t", "proc", "proc", str(root / "proc")], "mount /proc in the chroot")
            try:
                _run(["mount", "--bind", "/dev", str(root / "dev")], "bind-mount /dev in the chroot")
                install = f"apt-get update && apt-get install -y --no-install-recommends {packages} && apt-get clean"
                env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
                _run(
                    ["chroot", str(root), "/bin/sh", "-c", install],
                    "apt-get in the chroot",
                    timeout=BUILD_TIMEOUT,
                    log=log,
                    env=env,
                )
            finally:
                _unmount_below(root)
            (root / "etc/resolv.conf").write_text("")
            (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n")
            self._import(root, spec, '["/bin/bash"]', log, ("./var/lib/apt/lists/*",))

    # kubernetes: the node's containerd

    def import_into_containerd(self, tag: str, address: str) -> None:
        log = self.state / "ctr-import.log"
        with _step(f"{tag}: imported into containerd at {address} (namespace k8s.io)"):
            _pipe(
                ["docker", "save", tag],
                ["ctr", "--address", address, "-n", "k8s.io", "images", "import", "-"],
                f"ctr import of {tag}",
                log=log,
            )


def _safe(tag: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", tag)


def _is_static_elf(path: str) -> bool:
    """An ELF executable without an interpreter (PT_INTERP) runs in an empty root."""
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2:  # 64-bit only: every busybox-static we use
            return False
        order = "little" if header[5] == 1 else "big"
        phoff = int.from_bytes(header[32:40], order)
        phentsize = int.from_bytes(header[54:56], order)
        phnum = int.from_bytes(header[56:58], order)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(int.from_bytes(table[i : i + 4], order) != 3 for i in range(0, len(table), phentsize))


def _unmount_below(root: Path) -> None:
    """Unmount whatever is mounted under ``root`` (an interrupted chroot leaves /proc, /dev)."""
    prefix = str(root).rstrip("/") + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


@contextlib.contextmanager
def _tree(root: Path) -> Iterator[Path]:
    """A fresh work tree, removed afterwards without crossing into another file system."""

    def drop() -> None:
        if root.exists() or root.is_symlink():
            _unmount_below(root)
            subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)

    drop()
    root.mkdir(parents=True)
    try:
        yield root
    finally:
        drop()


def apt_mirror(suite: str, apt_dir: str = "/etc/apt") -> str:
    """The Debian mirror apt uses here for ``suite`` (the only one known to be reachable):
    deb822 ``*.sources`` first, then one-line ``sources.list`` entries."""
    for path in sorted(glob.glob(f"{apt_dir}/sources.list.d/*.sources")):
        for stanza in Path(path).read_text(errors="replace").split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and suite in fields.get("suites", "").split():
                uris = fields.get("uris", "").split()
                if uris:
                    return uris[0]
    for path in [f"{apt_dir}/sources.list", *sorted(glob.glob(f"{apt_dir}/sources.list.d/*.list"))]:
        with contextlib.suppress(OSError):
            for line in Path(path).read_text(errors="replace").splitlines():
                words = re.sub(r"\[[^]]*\]", "", line).split()
                if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                    return words[1]
    return DEFAULT_MIRROR


@contextlib.contextmanager
def _build_lock(state: Path) -> Iterator[None]:
    """One build at a time per machine: two would debootstrap into the same tree."""
    with open(state / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"waiting for another build ({state / '.lock'})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def containerd_address() -> str | None:
    """The kubelet's containerd when it runs on this machine (a one-node cluster): the CI
    cluster's (``$ORCHARD_K8S_WORK``), ``$CONTAINERD_ADDRESS``, or the standard socket."""
    candidates = [
        os.environ.get("CONTAINERD_ADDRESS", ""),
        os.path.join(os.environ["ORCHARD_K8S_WORK"], "containerd/containerd.sock")
        if os.environ.get("ORCHARD_K8S_WORK")
        else "",
        "/run/containerd/containerd.sock",
    ]
    for address in candidates:
        if address and Path(address).is_socket() and os.access(address, os.W_OK):
            return address
    return None


def _select(names: list[str] | None) -> list[ImageSpec]:
    if not names:
        images = recipe_images()
        if not images:
            raise ConfigError("no recipe declares an image (IMAGES); name the images to build")
        return images
    known = known_images()
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ConfigError(f"unknown image {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return [known[name] for name in dict.fromkeys(names)]


def _docker_ready() -> None:
    if shutil.which("docker") is None:
        raise ConfigError("the docker CLI is not installed: install Docker (Debian: apt-get install docker.io)")
    try:
        done = subprocess.run(["docker", "info", "-f", "{{.ServerVersion}}"], capture_output=True, timeout=20)
    except subprocess.TimeoutExpired:
        raise ConfigError("the Docker daemon did not answer `docker info` within 20 s: restart it") from None
    if done.returncode != 0:
        why = _last_line(done.stderr.decode(errors="replace"))
        raise ConfigError(f"no Docker daemon answers ({why}): start dockerd (or point DOCKER_HOST at one)")


def build_images(names: list[str] | None, *, adapter: str = "docker", force: bool = False) -> int:
    """Build sandbox images (every recipe's when ``names`` is empty); the exit code.

    Prints one progress line per step with its seconds; a failure is one line on stderr
    (exit 2 for what the user must fix first, 1 for a build step that failed)."""
    started = time.monotonic()
    try:
        if adapter not in ("docker", "kubernetes"):
            raise ConfigError(f"images are built for the docker or kubernetes adapter, not {adapter!r}")
        images = _select(names)
        address = containerd_address() if adapter == "kubernetes" else None
        if adapter == "kubernetes" and address is None:
            raise ConfigError(
                "no containerd of a local one-node cluster here (CONTAINERD_ADDRESS, $ORCHARD_K8S_WORK or "
                "/run/containerd/containerd.sock): a multi-node cluster needs a registry, which is unsupported; "
                "import the image on each node (docker save TAG | ctr -n k8s.io images import -)"
            )
        if address is not None and shutil.which("ctr") is None:
            raise ConfigError("importing into containerd needs its `ctr` CLI: apt-get install containerd")
        _docker_ready()
        state = Path(os.environ.get("ORCHARD_IMAGE_STATE", "/var/tmp/orchard-images"))
        try:
            state.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot use {state} for work files ({exc}); set ORCHARD_IMAGE_STATE") from None
        builder = Builder(force=force, state=state)
        with _build_lock(state):
            for spec in images:
                builder.build(spec)
                if address is not None:
                    builder.import_into_containerd(spec.tag, address)
    except ConfigError as exc:
        print(f"orchard-async images: {exc}", file=sys.stderr)
        return 2
    except ImageBuildError as exc:
        print(f"orchard-async images: {exc}", file=sys.stderr)
        return 1
    _say(f"done in {time.monotonic() - started:.1f} s: {' '.join(spec.tag for spec in images)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m orchard_async.images build [NAMES...] [--test] [--adapter A] [--force]``:
    the same as ``orchard-async images build``, for scripts that run before the CLI is wired."""
    parser = argparse.ArgumentParser(prog="python -m orchard_async.images")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build sandbox images (default: every recipe's)")
    build.add_argument("names", nargs="*", metavar="NAME", help="image tags to build")
    build.add_argument(
        "--test",
        action="store_true",
        help="the test images too: " + ", ".join(s.tag for s in [*TEST_IMAGES, *ADAPTER_IMAGES]),
    )
    build.add_argument("--adapter", default="docker", choices=["docker", "kubernetes"])
    build.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    names: list[str] = list(args.names)
    if args.test:  # in addition to the named images, or to the recipes' by default
        try:
            tests = [spec.tag for spec in [*TEST_IMAGES, *ADAPTER_IMAGES]]
            names = (names or [spec.tag for spec in recipe_images()]) + tests
        except ConfigError as exc:
            print(f"orchard-async images: {exc}", file=sys.stderr)
            return 2
    return build_images(names or None, adapter=args.adapter, force=args.force)

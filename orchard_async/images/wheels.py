"""Python packages for a sandbox image, without a network in the build: the host's pip (with
whatever index this machine is configured for) downloads wheels for the image's Python and
glibc, and ``docker build`` copies them in and installs them with ``--no-index``.

Used by ``images.Builder`` for an ``ImageSpec`` with ``pip_packages`` (a Debian base with
``python3-pip`` among its ``apt_packages``).
"""

from __future__ import annotations

import platform
import shlex
import subprocess
import sys
from pathlib import Path

# Debian release -> (its python3's version, its glibc's minor version): the wheels must fit both.
DEBIAN_PYTHON = {"bookworm": ("3.11", 36), "trixie": ("3.13", 41)}
DOWNLOAD_TIMEOUT = 1800.0


class WheelDownloadFailed(Exception):
    pass


def platforms(glibc_minor: int, arch: str | None = None) -> list[str]:
    """Every manylinux tag a system with glibc 2.<glibc_minor> runs (pip does not widen ``--platform``)."""
    arch = arch or platform.machine()
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc_minor, 4, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]


def download(packages: tuple[str, ...], suite: str, into: Path, *, log: Path) -> None:
    """The wheels of ``packages`` and their dependencies, for ``suite``'s python3, into ``into``."""
    if suite not in DEBIAN_PYTHON:
        raise WheelDownloadFailed(
            f"pip_packages: no known python3 for Debian {suite} (known: {', '.join(DEBIAN_PYTHON)})"
        )
    version, glibc_minor = DEBIAN_PYTHON[suite]
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
            "--python-version", version, "-d", str(into)]  # fmt: skip
    for tag in platforms(glibc_minor):
        argv += ["--platform", tag]
    argv += list(packages)
    with log.open("ab") as sink:
        sink.write(f"$ {shlex.join(argv)}\n".encode())
        sink.flush()
        try:
            done = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, timeout=DOWNLOAD_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise WheelDownloadFailed(f"pip download did not finish within {DOWNLOAD_TIMEOUT:.0f} s") from None
    if done.returncode != 0:
        raise WheelDownloadFailed(f"pip download of {' '.join(packages)} failed (log {log})")


def dockerfile_lines(packages: tuple[str, ...]) -> str:
    """Install the copied wheels into the image's system python (a throwaway sandbox image:
    Debian's externally-managed marker is overridden on purpose)."""
    names = " ".join(shlex.quote(p) for p in packages)
    return (
        "COPY wheels /tmp/wheels\n"
        "RUN python3 -m pip install --no-index --find-links /tmp/wheels --no-cache-dir --break-system-packages "
        f"{names} && rm -rf /tmp/wheels\n"
    )

"""Sandbox images built on this machine, without a registry (placeholder until the builder lands)."""

from __future__ import annotations

from typing import Literal

import msgspec


class ImageSpec(msgspec.Struct, frozen=True):
    """An image a recipe needs: a tag, a base and the Debian packages on top."""

    tag: str
    base: Literal["busybox", "debian-minbase"]
    apt_packages: tuple[str, ...] = ()

"""Choosing the event loop and the adapter by name.

The loop: ``ORCHARD_LOOP`` = ``asyncio`` | ``uvloop`` | ``auto`` (uvloop when installed).
The default is ``asyncio``. Measured on the 2-core reference machine: uvloop spawns child
processes with a real fork, about 4x slower per spawn than asyncio's, which the local
adapter pays once per sandbox; its gain on the pipe traffic of the hot path did not make
up for that (see README, "Event loop").
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from .errors import AdapterUnavailable, ConfigError
from .protocols import Adapter

T = TypeVar("T")

DEFAULT_LOOP = "asyncio"
ADAPTERS = {
    "local": "orchard_async.adapters.local:LocalAdapter",
    "sim": "orchard_async.adapters.sim:SimAdapter",
    "docker": "orchard_async.adapters.docker:DockerAdapter",
    "kubernetes": "orchard_async.adapters.kubernetes:KubernetesAdapter",
}


def loop_choice(loop: str | None = None) -> str:
    """The loop that ``run`` will use: 'asyncio' or 'uvloop'."""
    choice = (loop or os.environ.get("ORCHARD_LOOP") or DEFAULT_LOOP).lower()
    if choice not in ("asyncio", "uvloop", "auto"):
        raise ConfigError(f"unknown event loop {choice!r}; use asyncio, uvloop or auto")
    if choice == "asyncio":
        return "asyncio"
    try:
        importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("uvloop is not installed; pip install 'orchard-async[fast]'") from None
        return "asyncio"
    return "uvloop"


def run(main: Callable[..., Awaitable[T]], *args: Any, loop: str | None = None) -> T:
    """Run ``main(*args)`` on the chosen event loop (see module docstring)."""
    return anyio.run(main, *args, backend="asyncio", backend_options={"use_uvloop": loop_choice(loop) == "uvloop"})


def get_adapter(name: str, **options: Any) -> Adapter:
    """An adapter by name: local, sim, docker, kubernetes."""
    if name not in ADAPTERS:
        raise ConfigError(f"unknown adapter {name!r}; choose one of: {', '.join(ADAPTERS)}")
    module_name, _, class_name = ADAPTERS[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise AdapterUnavailable(f"the {name} adapter is not part of this build yet") from None
        raise AdapterUnavailable(f"the {name} adapter needs {exc.name}; pip install 'orchard-async[{name}]'") from None
    return getattr(module, class_name)(**options)

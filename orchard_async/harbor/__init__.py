"""orchard-async as a Harbor environment provider: any adapter's sandboxes under Harbor's own
runner (``harbor run -e orchard_async.harbor:OrchardEnvironment --ek adapter=docker``).

Harbor (``pip install 'orchard-async[harbor]'``, Python 3.12 or later) is imported only when
the provider is: ``orchard_async.harbor.environment`` holds it, and this package names it
lazily so that the rest of orchard-async never needs Harbor.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OrchardEnvironment", "OrchardEnvironmentOptions"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from orchard_async.harbor import environment

        return getattr(environment, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

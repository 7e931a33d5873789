"""The trainer adapters' tests: each needs its trainer's package (the ``trainers`` extra) and
the token path's tiny model (tests/models/tiny_model.py, built once per session)."""

from __future__ import annotations

from tests.conftest import backend_missing
from tests.models.conftest import tiny_model  # noqa: F401 - the token path's tiny model fixture, reused

EXTRA = "pip install -e '.[trainers]'"


def require(*modules: str) -> None:
    """Skip (fail in CI) unless every module imports, naming the extra that brings them."""
    for module in modules:
        try:
            __import__(module)
        except ImportError as exc:
            backend_missing(f"the trainer adapters' tests need {module} ({exc}): {EXTRA}")

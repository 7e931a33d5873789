"""A source checkout imports every ``orchard_async.*`` name from itself.

The top-level folders ``adapters/``, ``recipes/`` and ``bench/`` are the subpackages
``orchard_async.adapters``, ``.recipes`` and ``.bench`` (pyproject's package-dir). An
editable install maps them to the checkout it was made from; a second checkout (a git
worktree, a fresh clone run from its root) would otherwise import its own core with another
checkout's adapters and recipes. When ``orchard_async`` is imported from a checkout, these
three names resolve to that checkout's folders.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

FOLDERS = {"orchard_async.adapters": "adapters", "orchard_async.recipes": "recipes", "orchard_async.bench": "bench"}


class CheckoutFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path):
        self.packages = {name: root / folder for name, folder in FOLDERS.items()}

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - the import system's signature
        folder = self.packages.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


def install(root: Path) -> None:
    if not (root / "pyproject.toml").is_file() or not all(
        (root / f / "__init__.py").is_file() for f in FOLDERS.values()
    ):
        return  # an installed wheel: its own layout already holds
    if not any(isinstance(finder, CheckoutFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, CheckoutFinder(root))


install(Path(__file__).resolve().parents[1])

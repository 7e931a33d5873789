"""The bundled offline SWE task set: data, not code the recipe runs.

``repos/`` holds the base trees, ``instances.jsonl`` the instances, ``make_repo`` turns a
tree into its pinned base commit, and ``generator/`` rebuilds ``instances.jsonl`` from
the task definitions (see README.md here).
"""

from __future__ import annotations

from pathlib import Path

BUILTIN_DIR = Path(__file__).resolve().parent
INSTANCES_PATH = BUILTIN_DIR / "instances.jsonl"
REPOS_DIR = BUILTIN_DIR / "repos"

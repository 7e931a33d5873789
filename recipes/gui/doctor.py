"""What `orchard-async doctor` should say about the GUI recipe on this host.

The local adapter runs the host's chromium inside its sandboxes; the container adapters
use the recipe's image instead. The driver (``inside/browserd.py --which``) is asked which
chromium it would start, so this check and the episodes look in the same places.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchard_async.recipes.gui.task import CHROMIUM_ENV, GuiOptions

BROWSERD = Path(__file__).parent / "inside" / "browserd.py"
MISSING = (
    "not found: install Debian's chromium (apt-get install chromium) or set the chromium option (docs/variables.md)"
)


def doctor(options: GuiOptions | Mapping[str, Any] | None = None) -> dict[str, str]:
    """One line per thing checked: {"chromium (local adapter)": "found ... | not found: ..."}."""
    return {"chromium (local adapter)": _chromium_line(GuiOptions.resolve(options).chromium)}


def _chromium_line(chromium: str | None) -> str:
    env = {name: value for name, value in os.environ.items() if name != CHROMIUM_ENV}
    if chromium:  # what an episode's driver gets (task.sandbox_spec)
        env[CHROMIUM_ENV] = chromium
    try:
        which = subprocess.run(
            [sys.executable, str(BROWSERD), "--which"], capture_output=True, text=True, timeout=30, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        return "unknown: the driver did not answer within 30 s"
    path = which.stdout.strip()
    if which.returncode != 0 or not path:
        return MISSING
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"found at {path}, but it does not run: {exc}"
    if version.returncode != 0:
        return f"found at {path}, but `--version` failed: {(version.stderr or version.stdout).strip()[:200]}"
    return f"{version.stdout.strip()} at {path}"

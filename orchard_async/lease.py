"""The controller's identity under the names the local adapter imports; orchard_async.labels
owns it (and every other ``orchard.*`` label) now. Kept until adapters/local.py imports
from labels."""

from __future__ import annotations

from orchard_async.labels import CONTROLLER as CONTROLLER_LABEL
from orchard_async.labels import controller_alive, controller_id, process_start_time

__all__ = ["CONTROLLER_LABEL", "controller_alive", "controller_id", "process_start_time"]

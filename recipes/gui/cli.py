"""The GUI recipe's command on ``orchard-async``: ``export-gui sft|rl|grpo TRAJECTORIES...
--screenshots DIR --out FILE`` (see ``export``): ``orchard-async export`` for GUI runs only.

Registered in the ``orchard_async.commands`` entry-point group: the core CLI lists it
without importing this recipe.
"""

from __future__ import annotations

import argparse

from orchard_async import check_trajectory_file
from orchard_async.recipes.gui.export import add_arguments
from orchard_async.records import export as training_data

EXPORT_HELP = "GUI trajectories -> SFT chats or GRPO groups with their screenshots (JSONL); GUI runs only"


def add_export_command(parser: argparse.ArgumentParser) -> None:
    """Fill the core CLI's ``export-gui`` subcommand."""
    parser.description = EXPORT_HELP
    add_arguments(parser)
    parser.set_defaults(func=export_command, recipe="gui")


def export_command(args: argparse.Namespace) -> int:
    """A run of another recipe is refused (its chat is not a web agent's), then the export
    is ``orchard-async export``'s."""
    sources = [check_trajectory_file(path) for path in [args.trajectories, *(args.more_trajectories or [])]]
    training_data.refuse_other_recipes(sources, "gui", "export-gui")
    return training_data.export_command(args)

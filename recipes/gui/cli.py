"""The GUI recipe's command on ``orchard-async``: ``export-gui sft|rl|grpo TRAJECTORIES...
--screenshots DIR --out FILE`` (see ``export``).

Registered in the ``orchard_async.commands`` entry-point group like the SWE recipe's
``export``: the core CLI lists it without importing this recipe.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from orchard_async import ConfigError, check_output_file, check_trajectory_file
from orchard_async.recipes.gui.export import add_arguments, run_export

EXPORT_HELP = "GUI trajectories -> SFT chats or GRPO groups with screenshots as image parts (JSONL)"


def add_export_command(parser: argparse.ArgumentParser) -> None:
    """Fill the core CLI's ``export-gui`` subcommand."""
    parser.description = EXPORT_HELP
    add_arguments(parser)
    parser.set_defaults(func=export_command)


def export_command(args: argparse.Namespace) -> int:
    """Every input and the output are checked before any work."""
    sources = [check_trajectory_file(path) for path in [args.trajectories, *(args.more_trajectories or [])]]
    out = check_output_file(args.out)
    if out.exists() and any(out.resolve() == source.resolve() for source in sources):
        raise ConfigError(f"--out {out} is a trajectory file being exported; write the export elsewhere")
    summary = run_export(args)
    Console(stderr=True).print(
        f"{args.format}: {summary.records} records ({summary.episodes} episodes, {summary.skipped} skipped: "
        f"{summary.skipped_reasons or 'none'}), success {summary.resolved_rate:.1%}, "
        f"reward mean {summary.mean_reward:.3f} -> {summary.path}"
    )
    return 0

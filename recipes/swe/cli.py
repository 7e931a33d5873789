"""The SWE recipe's commands on ``orchard-async``: ``export sft|rl|grpo TRAJECTORIES... --out FILE``.

Registered in the ``orchard_async.commands`` entry-point group, so the core CLI lists
``export`` without importing this recipe and calls ``add_export_command`` only when the
command runs (see ``orchard_async.Recipe``).
"""

from __future__ import annotations

import argparse

from rich.console import Console

from orchard_async import ConfigError, check_output_file, check_trajectory_file, read_run_header
from orchard_async.recipes.swe.export import add_arguments, run_export

EXPORT_HELP = "trajectories -> SFT chats or GRPO groups (JSONL)"


def add_export_command(parser: argparse.ArgumentParser) -> None:
    """Fill the core CLI's ``export`` subcommand."""
    parser.description = EXPORT_HELP
    add_arguments(parser)
    parser.set_defaults(func=export_command)


def export_command(args: argparse.Namespace) -> int:
    """Every input and the output are checked before any work: the inputs are trajectory
    files, the output can be written and is not one of them."""
    given = args.trajectories if isinstance(args.trajectories, list) else [args.trajectories]
    given += getattr(args, "more_trajectories", None) or []
    sources = [check_trajectory_file(path) for path in given]
    for source in sources:
        recipe = (read_run_header(source) or {}).get("recipe")
        if recipe == "gui":  # its chats have images, and a prompt of their own
            raise ConfigError(f"{source} is a run of the gui recipe; export it with `orchard-async export-gui`")
    out = check_output_file(args.out)
    if out.exists() and any(out.resolve() == source.resolve() for source in sources):
        raise ConfigError(f"--out {out} is a trajectory file being exported; write the export elsewhere")
    summary = run_export(args)
    Console(stderr=True).print(
        f"{args.format}: {summary.records} records ({summary.episodes} episodes, {summary.skipped} skipped), "
        f"resolved {summary.resolved_rate:.1%}, reward mean {summary.mean_reward:.3f} -> {summary.path}"
    )
    return 0

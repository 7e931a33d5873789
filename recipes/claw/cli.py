"""The Claw recipe's command on ``orchard-async``: ``claw validate DIR`` (per Claw-Eval task
folder: loads and runs, or why not; runs nothing) and ``claw report RUN.jsonl`` (per task:
completion, safety, robustness, pass@k and pass^k).

Registered in the ``orchard_async.commands`` entry-point group: the core CLI lists it
without importing this recipe.
"""

from __future__ import annotations

import argparse
import json
import sys

from orchard_async import check_trajectory_file, read_trajectories


def add_command(parser: argparse.ArgumentParser) -> None:
    """Fill the core CLI's ``claw`` subcommand."""
    actions = parser.add_subparsers(dest="claw_command", required=True, metavar="ACTION")
    validate = actions.add_parser("validate", help="per task of a Claw-Eval tasks folder: loads, runs, or why not")
    validate.add_argument("folder", metavar="DIR", help="a folder of <task_id>/task.yaml folders, or one task folder")
    validate.set_defaults(func=claw_command)
    report = actions.add_parser("report", help="per task: completion, safety, robustness, pass@k and pass^k")
    report.add_argument("file", metavar="RUN.jsonl", help="a trajectory file of a claw run")
    report.add_argument("--json", action="store_true", help="the rows as JSON")
    report.set_defaults(func=claw_command)


def claw_command(args: argparse.Namespace) -> int:
    from orchard_async.recipes.claw.claw_eval import report, report_lines, validate

    if args.claw_command == "report":
        rows = report(read_trajectories(check_trajectory_file(args.file)))
        if args.json:
            sys.stdout.write(json.dumps(rows) + "\n")
        else:
            print("\n".join(report_lines(rows)))
        return 0
    lines, cannot_run = validate(args.folder)
    for line in lines:
        print(line)
    return 1 if cannot_run else 0

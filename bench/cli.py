"""`orchard-async bench SCENARIO`: argument parsing and dispatch."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

from rich.console import Console

from orchard_async.errors import ConfigError
from orchard_async.runtime import run

from .report import Result, machine_info, print_result, write_json

SCENARIOS = ["exec"]


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("values must be positive integers")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("--adapter", default="local")
    parser.add_argument("--adapter-options", help="JSON object of adapter options")
    parser.add_argument("--concurrency", type=_int_list, default=[1, 64], help="comma-separated levels (default 1,64)")
    parser.add_argument("--ops", type=int, default=1000, help="operations per level (default 1000)")
    parser.add_argument("--command", dest="bench_command", default="true", help="the command to time (default true)")
    parser.add_argument("--json", dest="json_out", help="write the result as JSON to this file")


def main(args: argparse.Namespace) -> int:
    options = json.loads(args.adapter_options) if args.adapter_options else {}
    started = time.time()
    if args.scenario == "exec":
        from .exec import run_exec

        rows, leaked = run(
            lambda: run_exec(
                args.adapter, concurrency=args.concurrency, ops=args.ops, command=args.bench_command, adapter_options=options
            )
        )
    else:  # pragma: no cover - argparse restricts the choices
        raise ConfigError(f"unknown scenario {args.scenario}")
    result = Result(
        scenario=args.scenario,
        adapter=args.adapter,
        machine=machine_info(),
        rows=rows,
        started_at=started,
        command="orchard-async bench " + shlex.join(sys.argv[2:]),
        leaked=leaked,
    )
    print_result(result, Console())
    if args.json_out:
        write_json(result, args.json_out)
    return 0 if not leaked else 1

"""`orchard-async bench SCENARIO --adapter A [options] [--json FILE] [--plot FILE.png]`.

Scenarios: exec, burst, episodes, scale, chaos; and `bench compare A.json B.json`.
Adapters are looked up by name (``get_adapter``), so every scenario works on any adapter;
per-adapter baselines live in small registries (bench/floors.py, bench/chaos.py).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from rich.console import Console

from orchard_async import ConfigError, check_output_file, run
from orchard_async.bench import service as serve_bench
from orchard_async.bench.report import (
    Result,
    load_average,
    machine_info,
    print_result,
    to_markdown,
    write_json,
)

SCENARIOS = ["exec", "burst", "create", "episodes", "scale", "chaos", "turnaround"]
DEFAULT_ADAPTER = {
    "exec": "local",
    "burst": "local",
    "create": "local",
    "episodes": "local",
    "scale": "sim",
    "chaos": "sim",
    "turnaround": "sim",
}


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v.strip().lower().replace("k", "000")) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("values must be positive integers")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_command(parser: argparse.ArgumentParser) -> None:
    """Fill the core CLI's ``bench`` subcommand (built only when it is the command run)."""
    add_arguments(parser)
    parser.set_defaults(func=main)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--adapter", help="adapter name (default: local; sim for scale and chaos)")
    common.add_argument(
        "--adapter-options", help='JSON object of adapter options, e.g. \'{"image": "orchard/busybox:test"}\''
    )
    common.add_argument("--image", help="sandbox image for container adapters")
    common.add_argument("--json", dest="json_out", metavar="FILE", help="write the result as JSON to this file")
    common.add_argument("--plot", metavar="FILE.png", help="draw the result (needs matplotlib: the 'plot' extra)")
    common.add_argument("--markdown", metavar="FILE.md", help="write the tables as GitHub markdown (for the README)")
    common.add_argument(
        "--max-load",
        type=float,
        metavar="L",
        help="first wait (up to 10 min) until the 1-minute load average is below L",
    )
    sub = parser.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")

    p = sub.add_parser("exec", parents=[common], help="command round trip vs the floor (and --peers)")
    p.add_argument("--concurrency", type=_int_list, default=[1, 16, 64, 256], help="levels (default 1,16,64,256)")
    p.add_argument("--ops", type=_positive, default=1000, help="commands per level (at least 5 per loop; default 1000)")
    p.add_argument("--command", dest="bench_command", default="true", help="the command to time (default true)")
    p.add_argument("--peers", action="store_true", help="also measure peer runtimes (SWE-ReX) in this run")
    p.add_argument("--session", action="store_true", help="also measure a stateful session() at concurrency 1")
    p.add_argument("--no-floors", dest="floors", action="store_false", help="skip the floor baselines")

    p = sub.add_parser("burst", parents=[common], help="N sandboxes at once, K commands each, deleted; leftovers")
    p.add_argument("--sandboxes", "-n", type=_positive, default=200, help="sandboxes created at once (default 200)")
    p.add_argument("--commands", "-k", type=_positive, default=5, help="commands per sandbox (default 5)")
    p.add_argument("--command", dest="bench_command", default="true")
    p.add_argument("--op-timeout", type=float, default=300.0, help="bound on any one operation (s)")
    p.add_argument("--max-creating", type=_positive, help="cap concurrent creates (default: all at once)")
    p.add_argument(
        "--warm",
        type=_positive,
        metavar="W",
        help="also through a pool with W warm sandboxes: acquire p50/p99 cold vs warm, in one run",
    )
    p.add_argument(
        "--kill-apiserver",
        action="store_true",
        help="control-plane-only kubernetes: stop and restart the API server after half the creates",
    )
    p.add_argument(
        "--abandon",
        type=float,
        default=0.0,
        help="control-plane-only kubernetes: this share of the sandboxes is left (not closed) for a fresh reap",
    )

    p = sub.add_parser(
        "create", parents=[common], help="burst with no commands: create/delete rates (docker: vs `docker run -d`)"
    )
    p.add_argument(
        "--sandboxes", "--n", "-n", type=_positive, default=200, help="sandboxes created at once (default 200)"
    )
    p.add_argument("--op-timeout", type=float, default=300.0, help="bound on any one operation (s)")
    p.add_argument(
        "--max-creating", type=_positive, help="cap concurrent creates (default: the adapter's own admission)"
    )
    p.set_defaults(commands=0, bench_command="true")

    p = sub.add_parser("episodes", parents=[common], help="rollout throughput of a recipe at a concurrency sweep")
    p.add_argument("--concurrency", type=_int_list, default=[1, 8, 32], help="levels (default 1,8,32)")
    p.add_argument("--episodes", type=_positive, default=64, help="episodes per level (at least the level; default 64)")
    p.add_argument("--recipe", default="toy")
    p.add_argument("--tasks", default="builtin")
    p.add_argument("--policy", default="oracle")
    p.add_argument("--max-retries", type=int, default=2)
    p.add_argument("--group-size", type=_positive, default=1, help="samples per task group (default 1)")
    p.add_argument(
        "--fork",
        action="store_true",
        help="also run each level with groups set up once and forked from a snapshot (tasks that opt in), side by side",
    )
    p.add_argument(
        "--warm",
        action="store_true",
        help="also run each level with a warm pool (the next `concurrency` episodes' sandboxes created ahead); "
        "the runs without it are cold",
    )

    p = sub.add_parser("scale", parents=[common], help="the core alone on sim: 1k..20k concurrent episodes")
    p.add_argument(
        "--levels",
        type=_int_list,
        default=[1000, 5000, 10000, 20000],
        help="concurrent episodes (default 1k,5k,10k,20k)",
    )
    p.add_argument("--steps", type=_positive, default=20, help="steps per episode (default 20)")
    p.add_argument("--timeout", type=float, default=900.0, help="bound per level (s)")

    p = sub.add_parser(
        "chaos", parents=[common], help="injected faults (sim) or a SIGKILLed controller; lost and leaked"
    )
    p.add_argument("--episodes", type=_positive, help="episodes (default 400 on sim, 24 otherwise)")
    p.add_argument("--concurrency", type=_positive, help="concurrent episodes (default 32 on sim, 6 otherwise)")
    p.add_argument("--steps", type=_positive, help="steps per episode (default 10 on sim, 6 otherwise)")
    p.add_argument("--rounds", type=_positive, default=3, help="controllers SIGKILLed in turn (not sim; default 3)")
    p.add_argument(
        "--settle",
        type=float,
        help="seconds to let a killed run's sandboxes self-destruct before reap "
        "(default: the time the README promises for the adapter, else 10)",
    )

    p = sub.add_parser(
        "turnaround",
        parents=[common],
        help="token vs message policies against a fixed-latency engine: the environment's turnaround, throughput",
    )
    p.add_argument(
        "--concurrency", type=_int_list, default=[1, 64, 1024], help="concurrent episodes (default 1,64,1024)"
    )
    p.add_argument("--steps", type=_positive, default=10, help="steps per episode (default 10)")
    p.add_argument("--latency", type=float, default=0.1, help="the fake engine's seconds per generation (default 0.1)")
    p.add_argument(
        "--waves",
        type=_positive,
        default=4,
        help="the sustained run's episodes per concurrent slot: waves x concurrency episodes, "
        "concurrency in flight throughout (default 4; 1: one wave only)",
    )
    p.add_argument(
        "--processes",
        type=_positive,
        default=1,
        help="run the episodes in this many worker processes (orchard_async.ProcessRollout), "
        "one event loop each (default 1: the rollout on this process's loop)",
    )

    p = sub.add_parser(
        "service", help="exec through `orchard-async serve` vs in-process, and the remote adapter; create rates"
    )
    serve_bench.add_arguments(p)
    p.add_argument("--max-load", type=float, metavar="L", help="first wait (up to 10 min) for a load under L")

    p = sub.add_parser("compare", help="ratios between two result files (B/A)")
    p.add_argument("a", metavar="A.json")
    p.add_argument("b", metavar="B.json")

    p = sub.add_parser("show", help="print a saved result again (table, markdown or plot)")
    p.add_argument("file", metavar="RESULT.json")
    p.add_argument("--markdown", action="store_true", help="print GitHub markdown instead of a table")
    p.add_argument("--plot", metavar="FILE.png", help="draw it")


def _wait_for_load(limit: float, console: Console) -> None:
    deadline = time.monotonic() + 600
    while load_average() >= limit and time.monotonic() < deadline:
        console.print(f"waiting for the load average ({load_average()}) to fall below {limit} ...", style="dim")
        time.sleep(10)


async def _dispatch(args: argparse.Namespace, adapter: str, options: dict):  # noqa: ANN202
    scenario = args.scenario
    if scenario == "exec":
        from orchard_async.bench.exec import run_exec

        return await run_exec(
            adapter,
            concurrency=args.concurrency,
            ops=args.ops,
            command=args.bench_command,
            adapter_options=options,
            image=args.image,
            peers=args.peers,
            session=args.session,
            floors=args.floors,
        )
    if scenario == "burst" and args.warm:
        from orchard_async.bench.warm import run_warm_burst

        return await run_warm_burst(
            adapter,
            sandboxes=args.sandboxes,
            warm=args.warm,
            commands=args.commands,
            command=args.bench_command,
            adapter_options=options,
            image=args.image,
            op_timeout=args.op_timeout,
            max_creating=args.max_creating,
        )
    if scenario in ("burst", "create"):
        from orchard_async.bench.burst import run_burst

        return await run_burst(
            adapter,
            sandboxes=args.sandboxes,
            commands=args.commands,
            command=args.bench_command,
            adapter_options=options,
            image=args.image,
            op_timeout=args.op_timeout,
            max_creating=args.max_creating,
            kill_apiserver=getattr(args, "kill_apiserver", False),
            abandon=getattr(args, "abandon", 0.0),
        )
    if scenario == "episodes":
        from orchard_async.bench.episodes import run_episodes

        return await run_episodes(
            adapter,
            concurrency=args.concurrency,
            episodes=args.episodes,
            recipe=args.recipe,
            tasks=args.tasks,
            policy=args.policy,
            adapter_options=options,
            max_retries=args.max_retries,
            group_size=args.group_size,
            fork=args.fork,
            warm=args.warm,
        )
    if scenario == "scale":
        from orchard_async.bench.scale import run_scale

        return await run_scale(
            args.levels,
            steps=args.steps,
            adapter_name=adapter,
            adapter_options=json.dumps(options) if options else None,
            level_limit=args.timeout,
        )
    if scenario == "turnaround":
        from orchard_async.bench.turnaround import run_turnaround

        if not args.latency > 0:
            raise ConfigError(f"--latency must be a positive number of seconds, got {args.latency}")
        return await run_turnaround(
            adapter,
            concurrency=args.concurrency,
            steps=args.steps,
            latency=args.latency,
            waves=args.waves,
            processes=args.processes,
            adapter_options=options,
        )
    if scenario == "chaos":
        from orchard_async.bench.chaos import chaos_kill, chaos_sim

        if adapter == "sim":
            return await chaos_sim(
                episodes=args.episodes or 400,
                concurrency=args.concurrency or 32,
                steps=args.steps or 10,
                adapter_options=options,
            )
        return await chaos_kill(
            adapter,
            episodes=args.episodes or 24,
            concurrency=args.concurrency or 6,
            steps=args.steps or 6,
            adapter_options=options,
            image=args.image,
            settle=args.settle,
            rounds=args.rounds,
        )
    raise ConfigError(f"unknown scenario {scenario}")  # pragma: no cover - argparse restricts the choices


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=160)  # a file or a pipe: no wrapping at 80


def main(args: argparse.Namespace) -> int:
    console = _console()
    if args.scenario == "compare":
        from orchard_async.bench.compare import compare

        return compare(args.a, args.b, console)
    if args.scenario == "show":
        return _show(args, console)
    if args.scenario == "service":
        if args.max_load:
            _wait_for_load(args.max_load, console)
        return serve_bench.run(args)
    try:
        options = json.loads(args.adapter_options) if args.adapter_options else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--adapter-options is not valid JSON: {exc}") from None
    if not isinstance(options, dict):
        raise ConfigError("--adapter-options must be a JSON object")
    adapter = args.adapter or DEFAULT_ADAPTER[args.scenario]
    # Fail before a long run, not after it: every output can be written, and plotted.
    for flag, path in (("--json", args.json_out), ("--markdown", args.markdown), ("--plot", args.plot)):
        if path:
            check_output_file(path, what=flag)
    if args.plot:
        _check_plot(args.plot)
    if args.max_load:
        _wait_for_load(args.max_load, console)
    machine = machine_info()
    started = time.time()
    t0 = time.perf_counter()
    try:
        outcome = run(_dispatch, args, adapter, options)
    except RuntimeError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    machine["load_avg_1m_end"] = load_average()
    notes = list(outcome.notes)
    cores = machine.get("cores") or 1
    if max(machine["load_avg_1m"], machine["load_avg_1m_end"]) > cores:
        notes.append(
            f"the machine was busy (1-minute load {machine['load_avg_1m']} at start, {machine['load_avg_1m_end']} at end, "
            f"{cores} cores): numbers may be pessimistic; re-run with --max-load"
        )
    result = Result(
        scenario=args.scenario,
        adapter=adapter,
        machine=machine,
        rows=outcome.rows,
        started_at=started,
        wall_s=round(time.perf_counter() - t0, 3),
        command="orchard-async bench " + shlex.join(_argv()),
        lost=outcome.lost,
        leaked=outcome.leaked,
        comparisons=outcome.comparisons,
        details=outcome.details,
        notes=notes,
    )
    print_result(result, console)
    if args.json_out:
        write_json(result, args.json_out)
        console.print(f"result: {args.json_out}")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(to_markdown(result))
        console.print(f"markdown: {args.markdown}")
    if args.plot:
        from orchard_async.bench.plot import plot_result

        console.print(f"plot: {plot_result(result, args.plot)}")
    return 0 if not result.leaked and not result.lost else 1


def _check_plot(path: str) -> None:
    """matplotlib is there and can draw this file type (it picks the format by suffix)."""
    from orchard_async.bench.plot import _pyplot

    plt = _pyplot()
    formats = plt.matplotlib.backend_bases.FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in formats:
        raise ConfigError(f"--plot {path}: name the file with a picture suffix: {', '.join(sorted(formats))}")


def _show(args: argparse.Namespace, console: Console) -> int:
    if args.plot:
        check_output_file(args.plot, what="--plot")
        _check_plot(args.plot)
    from orchard_async.bench.compare import load_result

    result = load_result(args.file)
    if args.markdown:
        sys.stdout.write(to_markdown(result))
    else:
        print_result(result, console)
    if args.plot:
        from orchard_async.bench.plot import plot_result

        console.print(f"plot: {plot_result(result, args.plot)}")
    return 0


def _argv() -> list[str]:
    """The bench arguments as typed (when run from the command line)."""
    argv = sys.argv[1:]
    return argv[argv.index("bench") + 1 :] if "bench" in argv else ["(called from Python)"]

"""The `orchard-async` command: demo, run, export, inspect, reap, doctor, bench."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .errors import AdapterUnavailable, ConfigError, OrchardError
from .protocols import Adapter
from .rollout import collect
from .runtime import ADAPTERS, get_adapter, loop_choice, run
from .summary import Summary, summarize, to_json
from .trajectory import Trajectory, read_trajectories

console = Console(stderr=True)
RECIPES = {"swe": "orchard_async.recipes.swe", "toy": "orchard_async.recipes.toy"}


def load_recipe(name: str) -> Any:
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; choose one of: {', '.join(RECIPES)}")
    return importlib.import_module(RECIPES[name])


def make_adapter(name: str, options: str | None) -> Adapter:
    try:
        parsed = json.loads(options) if options else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--adapter-options is not valid JSON: {exc}") from None
    return get_adapter(name, **parsed)


# -- rollouts ------------------------------------------------------------------------------


async def _rollout_command(args: argparse.Namespace, out: Path, resume: bool) -> int:
    recipe = load_recipe(args.recipe)
    tasks = recipe.load_tasks(args.tasks)
    policy = recipe.make_policy(args.policy)
    adapter = make_adapter(args.adapter, args.adapter_options)
    finished: list[Trajectory] = []
    started = time.perf_counter()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("ok {task.fields[ok]}  failed {task.fields[failed]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task(f"{args.recipe} on {args.adapter}", total=args.episodes, ok=0, failed=0)

        def advance(trajectory: Trajectory) -> None:
            finished.append(trajectory)
            ok = sum(t.success for t in finished)
            progress.update(bar, advance=1, ok=ok, failed=sum(t.status == "failed" for t in finished))

        try:
            result = await collect(
                tasks,
                policy,
                adapter,
                out,
                resume=resume,
                on_trajectory=advance,
                n=args.episodes,
                group_size=args.group_size,
                concurrency=args.concurrency,
                max_retries=args.max_retries,
            )
            progress.update(bar, total=len(finished), completed=len(finished))
        finally:
            with anyio.CancelScope(shield=True):
                leaked = len(await adapter.list_owned())
                await adapter.close()
                aclose = getattr(policy, "aclose", None)  # model policies hold an HTTP client
                if aclose is not None:
                    await aclose()
    summary = summarize(finished, wall_s=time.perf_counter() - started, leaked=leaked)
    print_summary(summary, title=f"{args.recipe} · {policy.name} · {args.adapter}")
    if result.skipped:
        console.print(f"resumed: {result.skipped} episodes were already in {out}")
    console.print(f"trajectories: {out}")
    return 0 if leaked == 0 else 1


def print_summary(summary: Summary, title: str) -> None:
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    rows: list[tuple[str, str]] = [
        ("episodes", str(summary.episodes)),
        ("finished / failed", f"{summary.finished} / {summary.failed}"),
        ("success rate", f"{summary.success_rate:.1%}"),
        ("reward mean", f"{summary.mean_reward:.3f}"),
        ("steps", str(summary.steps)),
    ]
    if summary.steps_per_s is not None:
        rows.append(("steps/s", f"{summary.steps_per_s:.1f}"))
        rows.append(("episodes/s", f"{summary.episodes_per_s:.2f}"))
    rows += [
        ("exec p50 / p99", f"{summary.exec_p50_ms:.1f} ms / {summary.exec_p99_ms:.1f} ms"),
        ("episode end reasons", ", ".join(f"{k} {v}" for k, v in summary.exit_reasons.items()) or "-"),
        ("command exit reasons", ", ".join(f"{k} {v}" for k, v in summary.command_reasons.items()) or "-"),
        ("infra retries", str(summary.retries)),
        ("time share", ", ".join(f"{k} {v:.0%}" for k, v in summary.time_share.items()) or "-"),
    ]
    if summary.leaked is not None:
        rows.append(("sandboxes leaked", str(summary.leaked)))
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)


def cmd_demo(args: argparse.Namespace) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "trajectories.jsonl"
    out.unlink(missing_ok=True)  # a demo starts fresh; `run` is the command that resumes
    args.group_size, args.max_retries = 1, 2
    return run(_rollout_command, args, out, False)


def cmd_run(args: argparse.Namespace) -> int:
    return run(_rollout_command, args, Path(args.out), args.resume)


# -- other commands ------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    from orchard_async.recipes.swe.export import run_export

    summary = run_export(args)
    console.print(
        f"{args.format}: {summary.records} records ({summary.episodes} episodes, {summary.skipped} skipped), "
        f"resolved {summary.resolved_rate:.1%}, reward mean {summary.mean_reward:.3f} -> {summary.path}"
    )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.exists():
        raise ConfigError(f"{path}: no such file")
    summary = summarize(read_trajectories(path))
    if args.json:
        sys.stdout.buffer.write(to_json(summary) + b"\n")
    else:
        print_summary(summary, title=str(path))
    return 0


def cmd_reap(args: argparse.Namespace) -> int:
    async def reap() -> list[str]:
        adapter = make_adapter(args.adapter, args.adapter_options)
        try:
            return await adapter.reap(args.older_than)
        finally:
            await adapter.close()

    removed = run(reap)
    for sandbox_id in removed:
        print(f"removed {sandbox_id}")
    console.print(f"reaped {len(removed)} sandbox(es) on {args.adapter}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    table = Table(title="adapters")
    table.add_column("adapter", style="bold")
    table.add_column("usable")
    table.add_column("why / notes")
    for name in ADAPTERS:
        try:
            adapter = get_adapter(name)
            doctor = getattr(adapter, "doctor", None)
            notes = run(doctor) if doctor else "ready"
            table.add_row(name, "yes", notes)
        except (AdapterUnavailable, OrchardError) as exc:
            table.add_row(name, "no", str(exc))
    out = Console()
    out.print(table)
    from orchard_async.adapters.local import isolation_report

    isolation = Table(title="local adapter isolation in force")
    isolation.add_column("what", style="bold")
    isolation.add_column("status")
    for what, status in isolation_report().items():
        isolation.add_row(what, status)
    out.print(isolation)
    out.print(f"event loop: {loop_choice()} (set ORCHARD_LOOP=asyncio|uvloop|auto)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from orchard_async.bench.cli import main as bench_main

    return bench_main(args)


# -- parser --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchard-async", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def rollout_options(p: argparse.ArgumentParser, *, episodes: int, concurrency: int) -> None:
        p.add_argument("--adapter", default="local", help=f"one of {', '.join(ADAPTERS)} (default local)")
        p.add_argument("--adapter-options", help="JSON object of adapter options")
        p.add_argument("--episodes", type=int, default=episodes)
        p.add_argument("--concurrency", type=int, default=concurrency)

    demo = sub.add_parser("demo", help="the main job: the bundled SWE tasks solved by the oracle policy")
    rollout_options(demo, episodes=32, concurrency=8)
    demo.add_argument("--recipe", default="swe", choices=sorted(RECIPES), help="recipe to demo (default swe)")
    demo.add_argument("--out", default="out/demo", help="directory for trajectories.jsonl (default out/demo)")
    demo.set_defaults(func=cmd_demo, tasks="builtin", policy="oracle")

    run_p = sub.add_parser("run", help="collect rollouts into a trajectory file")
    run_p.add_argument("recipe", nargs="?", default="toy", help=f"one of {', '.join(RECIPES)} (default toy)")
    run_p.add_argument(
        "--tasks",
        default="builtin",
        help="task source for the recipe (default builtin; swe: builtin[:IDS] or a .jsonl/.json file)",
    )
    run_p.add_argument(
        "--policy", default="oracle", help="toy: oracle|random; swe: oracle|empty|openai (default oracle)"
    )
    rollout_options(run_p, episodes=32, concurrency=8)
    run_p.add_argument("--group-size", type=int, default=1, help="samples per task (GRPO groups)")
    run_p.add_argument("--max-retries", type=int, default=2, help="retries of infrastructure failures per episode")
    run_p.add_argument("--out", required=True, help="trajectory file (.jsonl or .msgpack)")
    run_p.add_argument("--resume", action="store_true", help="skip episodes already in --out")
    run_p.set_defaults(func=cmd_run)

    export = sub.add_parser("export", help="trajectories -> SFT chats or GRPO groups (JSONL)")
    from orchard_async.recipes.swe.export import add_arguments as add_export_arguments

    add_export_arguments(export)
    export.set_defaults(func=cmd_export)

    inspect = sub.add_parser("inspect", help="summarise a trajectory file")
    inspect.add_argument("file")
    inspect.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    inspect.set_defaults(func=cmd_inspect)

    reap = sub.add_parser("reap", help="remove sandboxes left behind by dead runs")
    reap.add_argument("--adapter", default="local")
    reap.add_argument("--adapter-options", help="JSON object of adapter options")
    reap.add_argument("--older-than", type=float, default=0.0, help="also wait this long past expiry (seconds)")
    reap.set_defaults(func=cmd_reap)

    doctor = sub.add_parser("doctor", help="which adapters work here, and what isolation is in force")
    doctor.set_defaults(func=cmd_doctor)

    bench = sub.add_parser("bench", help="measure sandbox latency and throughput against baselines")
    from orchard_async.bench.cli import add_arguments

    add_arguments(bench)
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        console.print(
            "[yellow]interrupted[/]: every sandbox was destroyed; finished episodes are on disk (use --resume)"
        )
        return 130
    except (OrchardError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The `orchard-async` command: demo, run, inspect, reap, doctor, images, bench, and the recipes' own.

Bad input is one line on stderr and exit status 2, never a traceback: every check that
can fail runs before the first sandbox is created.

Building the parser imports no recipe and no bench module: recipes are found by name
(their entry points), and a command whose code lives elsewhere (``bench``, a recipe's
``export``) is listed by name and built in full only when it is the command being run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import sys
import time
import warnings
from collections.abc import Sequence
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, NoReturn

import anyio
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from orchard_async.capabilities import Doctor, facts_of
from orchard_async.engine.collector import tune_for_rollouts
from orchard_async.engine.plan import plan
from orchard_async.engine.rollout import collect
from orchard_async.errors import AdapterUnavailable, ConfigError, OrchardError
from orchard_async.protocols import Adapter, Recipe
from orchard_async.records.paths import check_output_dir, check_output_file
from orchard_async.records.summary import Summary, summarize, to_json
from orchard_async.records.trajectory import (
    Trajectory,
    check_trajectory_file,
    check_trajectory_path,
    read_trajectories,
)
from orchard_async.runtime import (
    ADAPTERS,
    COMMAND_GROUP,
    get_adapter,
    load_entry_point,
    load_recipe,
    loop_choice,
    recipe_commands,
    recipe_names,
    recipe_of,
    recipe_options,
    run,
)

console = Console(stderr=True)

# The core's own commands whose code is not in the core: name -> ("module:add_command", help).
# ``add_command(parser)`` adds the command's arguments and sets ``func``.
OUTSIDE_COMMANDS = {
    "bench": ("orchard_async.bench.cli:add_command", "measure sandbox latency and throughput against baselines"),
    "serve": ("orchard_async.apps.serve.cli:add_serve_command", "run the environment service (Orchard Env's HTTP API)"),
    "view": ("orchard_async.apps.view.cli:add_view_command", "look at a run in the browser"),
    "export": ("orchard_async.records.export:add_command", "trajectories -> training data, in the recipe's own chat"),
}

# Adapter options that say where and how to reach the backend, not what an episode sees:
# they may change between a run and its --resume. Every other option is part of the run.
OPERATIONAL_OPTIONS = frozenset(
    {
        "url",
        "api_key",  # a secret: never written to a run header
        "max_connections",
        "run_id",
        "owner",
        "root",
        "max_creating",
        "max_api",
        "api_timeout",
        "api_retry_for",
        "attach_grace",
        "exit_with_shell",
        "namespace",
        "context",
        "kubeconfig",
        "in_cluster",
        "node_selector",
        "tolerations",
        "priority_class",
        "manage_network_policies",
        "transport",
        "heartbeat",
    }
)


class UsageError(ConfigError):
    """A command line argparse rejected."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage error raised as one line instead of a usage block and exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def parse_adapter_options(options: str | None) -> dict[str, Any]:
    try:
        parsed = json.loads(options) if options else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--adapter-options is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"--adapter-options must be a JSON object like '{{\"image\": ...}}', got {options}")
    return parsed


def parse_recipe_options(options: str | None, name: str, recipe: Recipe) -> dict[str, Any]:
    """``--recipe-options`` as a dict; what is not a JSON object is a ConfigError that names the
    recipe's options (their types are checked by ``recipe_options``)."""
    options_class = getattr(recipe, "OPTIONS", None)
    known = (
        f"the {name} recipe's options are: {options_class.names()}"
        if options_class
        else f"the {name} recipe takes none"
    )
    try:
        parsed = json.loads(options) if options else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--recipe-options is not valid JSON ({exc}); {known}") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"--recipe-options must be a JSON object like '{{\"key\": value}}', got {options}; {known}")
    return parsed


def make_adapter(name: str, options: str | dict[str, Any] | None) -> Adapter:
    parsed = options if isinstance(options, dict) else parse_adapter_options(options)
    return get_adapter(name, **parsed)


# -- rollouts ------------------------------------------------------------------------------


async def close_policy(policy: object) -> None:
    """A policy's optional ``close`` (protocols.Policy: a model policy's HTTP client). One
    written when the verb was ``aclose`` is closed too, with a DeprecationWarning."""
    close = getattr(policy, "close", None)
    if close is None:
        close = getattr(policy, "aclose", None)
        if close is None:
            return
        warnings.warn(
            f"{type(policy).__name__}.aclose(): a policy's end verb is close() now", DeprecationWarning, stacklevel=2
        )
    await close()


def make_policy(args: argparse.Namespace, recipe: Recipe, with_options: dict[str, Any]) -> Any:
    """The run's policy: ``--policy tokens`` (any recipe: token in, token out through
    ``--engine``), else the recipe's own by name."""
    engine, tokenizer = getattr(args, "engine", None), getattr(args, "tokenizer", None)
    if args.policy != "tokens":
        if engine or tokenizer:
            raise ConfigError("--engine and --tokenizer go with --policy tokens")
        return recipe.make_policy(args.policy, **with_options)
    if not engine:
        raise ConfigError("--policy tokens needs --engine sglang:URL, vllm:URL or transformers:PATH")
    from orchard_async.models.tokens.policy import token_policy  # torch and transformers only when asked

    return token_policy(args.recipe, engine, tokenizer=tokenizer)


async def _rollout_command(args: argparse.Namespace, out: Path, resume: bool, replace: bool) -> int:
    """Everything that can be wrong is checked before the first sandbox: the --out path by
    the caller (kind, name, writable), then adapter options, recipe, its options, tasks, the
    plan, policy, the adapter, and in ``collect`` the existing file (on resume: the same run)."""
    options = parse_adapter_options(args.adapter_options)
    recipe = load_recipe(args.recipe)
    given = parse_recipe_options(args.recipe_options, args.recipe, recipe)
    in_force = recipe_options(args.recipe, recipe, given)
    with_options = {} if in_force is None else {"options": in_force}  # a recipe without OPTIONS is called as before
    tasks = recipe.load_tasks(args.tasks, **with_options)
    plan(tasks, args.episodes, args.group_size)
    policy = make_policy(args, recipe, with_options)
    adapter: Adapter | None = None
    finished: list[Trajectory] = []
    leaked: int | None = None
    # exited last: the adapter (its sandboxes, its task group) is closed after the count of leftovers
    async with contextlib.AsyncExitStack() as adapters:
        try:
            adapter = await adapters.enter_async_context(check_runs_on(make_adapter(args.adapter, options), args))
            header = {
                "recipe": args.recipe,
                "task_source": args.tasks,
                "adapter_options": {k: v for k, v in sorted(options.items()) if k not in OPERATIONAL_OPTIONS},
            }
            recorded = in_force.run_header(given) if in_force is not None else {}
            if recorded:  # only the options given, and only then: a run from before options still resumes
                header["recipe_options"] = recorded
            image = facts_of(adapter).image  # the image in force, default or not
            if image is not None:
                header["image"] = image
            started = time.perf_counter()
            with Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("ok {task.fields[ok]}  failed {task.fields[failed]}"),
                TimeElapsedColumn(),
                console=console,
                transient=False,
                disable=not console.is_terminal,  # in a log the summary says it all; a bar is noise
            ) as progress:
                bar = progress.add_task(f"{args.recipe} on {args.adapter}", total=args.episodes, ok=0, failed=0)

                counts = {"ok": 0, "failed": 0}  # running: a sum over every episode each time is quadratic

                def advance(trajectory: Trajectory) -> None:
                    finished.append(trajectory)
                    counts["ok"] += bool(trajectory.success)
                    counts["failed"] += trajectory.status == "failed"
                    progress.update(bar, advance=1, **counts)

                try:
                    result = await collect(
                        tasks,
                        policy,
                        adapter,
                        out,
                        resume=resume,
                        replace=replace,
                        run_header=header,
                        on_trajectory=advance,
                        n=args.episodes,
                        group_size=args.group_size,
                        concurrency=args.concurrency,
                        max_retries=args.max_retries,
                        warm=getattr(args, "warm", None),
                    )
                except Exception:
                    progress.live.transient = True  # the error is the one line to see, not a bar above it
                    raise
                progress.update(bar, total=len(finished), completed=len(finished))
        finally:
            with anyio.CancelScope(shield=True):
                if adapter is not None:
                    leaked = len(await adapter.list_owned())
                await close_policy(policy)
    summary = summarize(finished, wall_s=time.perf_counter() - started, leaked=leaked)
    print_summary(summary, title=f"{args.recipe} · {policy.name} · {args.adapter}")
    if result.skipped:
        console.print(f"resumed: {result.skipped} episodes were already in {out}")
    console.print(f"trajectories: {out}")
    bar = getattr(args, "min_judged", 0.0)
    if summary.episodes and (summary.judged == 0 or summary.judged / summary.episodes + 1e-9 < bar):
        console.print(
            f"[red]error:[/] {summary.judged} of {summary.episodes} episodes were judged, below --min-judged {bar:g} "
            f"(end reasons: {', '.join(f'{k} {v}' for k, v in summary.exit_reasons.items())})",
            soft_wrap=True,
            highlight=False,
        )
        return 1
    return 0 if leaked == 0 else 1


def _shown(value: float | None, form: str, nothing: str = "-") -> str:
    """A number of the summary, or ``nothing`` where there was nothing to measure (never "nan")."""
    return nothing if value is None or math.isnan(value) else form.format(value)


def check_runs_on(adapter: Adapter, args: argparse.Namespace) -> Adapter:
    """The adapter, when it has what the recipe needs (its ``ADAPTER_NEEDS``: names of facts
    the adapter must have true, e.g. ``runs_commands``, which the sim adapter has false); else
    a ConfigError before the first sandbox."""
    recipe = load_recipe(args.recipe)
    facts = facts_of(adapter)
    lacking = sorted(need for need in getattr(recipe, "ADAPTER_NEEDS", ()) if not getattr(facts, need, True))
    if lacking:
        raise ConfigError(
            f"the {args.recipe} recipe cannot run on the {args.adapter} adapter: it needs an adapter with "
            f"{', '.join(lacking)}, and the {args.adapter} adapter's is false; use another --adapter "
            "(local, docker, kubernetes, remote)"
        )
    return adapter


def print_summary(summary: Summary, title: str, out: Console | None = None) -> None:
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    rows: list[tuple[str, str]] = [
        ("episodes", str(summary.episodes)),
        ("finished / failed", f"{summary.finished} / {summary.failed}"),
        ("judged", str(summary.judged)),
        # over the judged episodes: with none judged there is no rate to show
        ("success rate", _shown(summary.success_rate, "{:.1%}", "- (none judged)")),
        ("reward mean", _shown(summary.mean_reward, "{:.3f}")),
        ("steps", str(summary.steps)),
    ]
    if summary.steps_per_s is not None:
        rows.append(("steps/s", f"{summary.steps_per_s:.1f}"))
        rows.append(("episodes/s", f"{summary.episodes_per_s:.2f}"))
    # Episodes nobody could judge, or whose model was down: never rewards, so never hidden
    # in the success rate. Red when there are any.
    for label, field in (("verifier errors", "verifier_errors"), ("model unavailable", "model_unavailable")):
        count = getattr(summary, field, 0)
        rows.append((f"[red]{label}[/]", f"[red]{count}[/]") if count else (label, str(count)))
    rows += [
        ("exec p50 / p99", _shown(summary.exec_p50_ms, "{:.1f} ms") + _shown(summary.exec_p99_ms, " / {:.1f} ms", "")),
        ("episode end reasons", ", ".join(f"{k} {v}" for k, v in summary.exit_reasons.items()) or "-"),
        ("command exit reasons", ", ".join(f"{k} {v}" for k, v in summary.command_reasons.items()) or "-"),
        ("infra retries", str(summary.retries)),
        ("time share", ", ".join(f"{k} {v:.0%}" for k, v in summary.time_share.items()) or "-"),
    ]
    if summary.pass_at_k:
        ks = [k for k in summary.pass_at_k if k in {"1", "3", max(summary.pass_at_k, key=int)}]
        rows.append(("pass@k", ", ".join(f"pass@{k} {summary.pass_at_k[k]:.3f}" for k in ks)))
        rows.append(("pass^k", ", ".join(f"pass^{k} {summary.pass_hat_k[k]:.3f}" for k in ks)))
    if summary.leaked is not None:
        rows.append(("sandboxes leaked", str(summary.leaked)))
    for name, value in rows:
        table.add_row(name, value)
    (out or Console()).print(table)


def cmd_demo(args: argparse.Namespace) -> int:
    out = check_output_file(check_output_dir(args.out) / "trajectories.jsonl")
    args.group_size, args.max_retries = 1, 2
    # A demo starts fresh (`run` is the command that resumes): the old file is replaced when
    # the first episode ends, so a demo that fails before that leaves it as it was.
    code = run(_rollout_command, args, out, False, True)
    print_next_steps(out)
    return code


def next_steps(run_file: Path) -> list[tuple[str, str]]:
    """What a newcomer does with a run file next: (the exact command, what it gives)."""
    here = shlex.quote(str(run_file))
    sft = shlex.quote(str(run_file.with_name("sft.jsonl")))
    return [
        (f"orchard-async view {here}", "every episode in the browser: steps, outputs, scores"),
        (f"orchard-async inspect {here}", "this summary again (--json for scripts)"),
        (f"orchard-async export sft {here} --out {sft}", "the judged episodes as chat training data"),
    ]


def print_next_steps(run_file: Path) -> None:
    console.print("next steps:", highlight=False)
    for command, what in next_steps(run_file):
        console.print(f"  {command}  # {what}", markup=False, highlight=False, soft_wrap=True)


def cmd_run(args: argparse.Namespace) -> int:
    out = check_trajectory_path(check_output_file(args.out))
    return run(_rollout_command, args, out, args.resume, False)


# -- other commands ------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    path = check_trajectory_file(args.file)
    summary = summarize(read_trajectories(path))
    if args.json:
        sys.stdout.buffer.write(to_json(summary) + b"\n")
    else:
        print_summary(summary, title=str(path))
    return 0


def cmd_reap(args: argparse.Namespace) -> int:
    async def reap() -> list[str]:
        async with make_adapter(args.adapter, args.adapter_options) as adapter:
            return await adapter.reap(args.older_than)

    removed = run(reap)
    for sandbox_id in removed:
        print(f"removed {sandbox_id}")
    console.print(f"reaped {len(removed)} sandbox(es) on {args.adapter}")
    return 0


async def _doctor(name: str) -> str:
    """The adapter's own report (its optional ``doctor()``; see capabilities.Doctor)."""
    async with get_adapter(name) as adapter:
        return await adapter.doctor() if isinstance(adapter, Doctor) else "ready"


def cmd_doctor(args: argparse.Namespace) -> int:
    table = Table(title="adapters")
    table.add_column("adapter", style="bold")
    table.add_column("usable")
    table.add_column("why / notes")
    # An adapter's report is plain text, never markup: rich would take `[docker]` in
    # `pip install 'orchard-async[docker]'` for a style and print the command without it.
    for name in ADAPTERS:
        try:
            table.add_row(name, "yes", escape(run(_doctor, name)))
        except (AdapterUnavailable, OrchardError) as exc:
            table.add_row(name, "no", escape(str(exc)))
        except Exception as exc:  # noqa: BLE001 - one adapter's bug must not hide the others' reports
            table.add_row(name, "no", f"[red]its doctor failed (a bug):[/] {escape(f'{type(exc).__name__}: {exc}')}")
    out = Console()
    out.print(table)
    from orchard_async.adapters.local import isolation_report  # only here: the local adapter is not the core's

    isolation = Table(title="local adapter isolation in force")
    isolation.add_column("what", style="bold")
    isolation.add_column("status")
    for what, status in isolation_report().items():
        isolation.add_row(what, escape(status))
    out.print(isolation)
    out.print(_recipes_report())
    out.print(f"event loop: {loop_choice()} (set ORCHARD_LOOP=asyncio|uvloop|auto)")
    return 0


def _recipes_report() -> Table:
    """What each installed recipe with a ``doctor()`` needs here (e.g. the GUI recipe's chromium)."""
    table = Table(title="recipes")
    table.add_column("recipe", style="bold")
    table.add_column("what", style="bold")
    table.add_column("status")
    for name in recipe_names():
        try:
            check = getattr(load_recipe(name), "doctor", None)
            lines = {what: escape(status) for what, status in (check() if callable(check) else {}).items()}
        except Exception as exc:  # noqa: BLE001 - one recipe's bug must not hide the others' reports
            lines = {"doctor": f"[red]failed:[/] {escape(f'{type(exc).__name__}: {exc}')}"}
        for what, status in lines.items():
            table.add_row(name, what, status)
    return table


def cmd_images(args: argparse.Namespace) -> int:
    try:
        from orchard_async.images.build import build_images
    except ImportError as exc:
        raise ConfigError(f"image building is not available in this install ({exc})") from None
    return build_images(args.names, adapter=args.adapter, force=args.force)


# -- parser --------------------------------------------------------------------------------


def _at_least(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction from 0 to 1, got {text}")
    return value


def _command_in(argv: Sequence[str]) -> str | None:
    """The command named on the command line: its first word that is not an option (the
    top level takes no option but --help)."""
    return next((word for word in argv if not word.startswith("-")), None)


def outside_commands() -> dict[str, tuple[EntryPoint, str]]:
    """Commands built by code outside the core, by name: the entry point of their
    ``add_command`` and their help line. Listing them imports nothing."""
    commands = {
        name: (EntryPoint(name, target, COMMAND_GROUP), help_line)
        for name, (target, help_line) in OUTSIDE_COMMANDS.items()
    }
    for name, point in recipe_commands().items():
        recipe = recipe_of(point)
        owner = f"the {recipe} recipe" if recipe else point.value
        commands.setdefault(name, (point, f"a command of {owner} (orchard-async {name} --help)"))
    return commands


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv`` (default: this process's arguments). Every command is
    listed; one built outside the core is filled in only when ``argv`` names it."""
    chosen = _command_in(sys.argv[1:] if argv is None else argv)
    recipes = recipe_names()
    parser = OneLineParser(prog="orchard-async", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def rollout_options(p: argparse.ArgumentParser, *, episodes: int, concurrency: int) -> None:
        p.add_argument("--adapter", default="local", help=f"one of {', '.join(ADAPTERS)} (default local)")
        p.add_argument("--adapter-options", help="JSON object of adapter options")
        p.add_argument(
            "--recipe-options",
            help="JSON object of the recipe's options (docs/variables.md; its ORCHARD_* variables are their defaults)",
        )
        p.add_argument("--episodes", type=_at_least(1), default=episodes, help=f"episodes to run (default {episodes})")
        p.add_argument(
            "--concurrency", type=_at_least(1), default=concurrency, help=f"episodes at once (default {concurrency})"
        )
        p.add_argument(
            "--min-judged",
            type=_fraction,
            default=0.0,
            metavar="FRACTION",
            help="exit 1 unless more than none and at least this fraction of the episodes were judged "
            "(default 0: at least one)",
        )

    demo = sub.add_parser("demo", help="the main job: the bundled SWE tasks solved by the oracle policy")
    rollout_options(demo, episodes=32, concurrency=8)
    demo.add_argument("--recipe", default="swe", choices=recipes, help="recipe to demo (default swe)")
    demo.add_argument("--out", default="out/demo", help="directory for trajectories.jsonl (default out/demo)")
    demo.set_defaults(func=cmd_demo, tasks="builtin", policy="oracle")

    run_p = sub.add_parser("run", help="collect rollouts into a trajectory file")
    run_p.add_argument("recipe", nargs="?", default="toy", help=f"one of {', '.join(recipes)} (default toy)")
    run_p.add_argument(
        "--tasks",
        default="builtin",
        help="task source for the recipe (default builtin; swe: builtin[:IDS] or a .jsonl/.json file)",
    )
    run_p.add_argument(
        "--policy",
        default="oracle",
        help="oracle|empty|noisy-oracle:P|tokens on every recipe; toy: random; swe, gui, claw: openai; claw: harness "
        "(default oracle)",
    )
    run_p.add_argument(
        "--engine",
        metavar="KIND:WHERE",
        help="--policy tokens: the token engine, sglang:URL, vllm:URL or transformers:PATH (a model folder)",
    )
    run_p.add_argument(
        "--tokenizer", metavar="PATH", help="--policy tokens: the model's tokenizer folder (default: transformers:PATH)"
    )
    rollout_options(run_p, episodes=32, concurrency=8)
    run_p.add_argument("--group-size", type=_at_least(1), default=1, help="samples per task (GRPO groups)")
    run_p.add_argument(
        "--max-retries", type=_at_least(0), default=2, help="retries of infrastructure failures per episode"
    )
    run_p.add_argument(
        "--warm",
        type=_at_least(0),
        help="sandboxes created ahead for the next episodes (default: --concurrency on docker, kubernetes "
        "and remote, 0 elsewhere; 0: none)",
    )
    run_p.add_argument("--out", required=True, help="trajectory file (.jsonl or .msgpack)")
    run_p.add_argument(
        "--resume", action="store_true", help="continue the same run in --out (refused if its settings differ)"
    )
    run_p.set_defaults(func=cmd_run)

    inspect = sub.add_parser("inspect", help="summarise a trajectory file")
    inspect.add_argument("file")
    inspect.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    inspect.set_defaults(func=cmd_inspect)

    reap = sub.add_parser("reap", help="remove sandboxes left behind by dead runs")
    reap.add_argument("--adapter", default="local")
    reap.add_argument("--adapter-options", help="JSON object of adapter options")
    reap.add_argument("--older-than", type=_seconds, default=0.0, help="also wait this long past expiry (seconds)")
    reap.set_defaults(func=cmd_reap)

    doctor = sub.add_parser("doctor", help="which adapters work here, and what isolation is in force")
    doctor.set_defaults(func=cmd_doctor)

    images = sub.add_parser("images", help="build the sandbox images recipes need (docker, kubernetes)")
    images_sub = images.add_subparsers(dest="images_command", required=True, metavar="ACTION")
    build = images_sub.add_parser("build", help="build the named images (default: every recipe's)")
    build.add_argument("names", nargs="*", metavar="NAME", help="images to build (default: all)")
    build.add_argument("--adapter", default="docker", choices=["docker", "kubernetes"], help="default docker")
    build.add_argument("--force", action="store_true", help="rebuild even when the image exists")
    build.set_defaults(func=cmd_images)

    for name, (point, help_line) in outside_commands().items():
        if name in sub.choices:
            continue  # a plugin cannot take over a core command
        command = sub.add_parser(name, help=help_line)
        if name == chosen:
            load_entry_point(point, f"the {name} command")(command)
    return parser


def one_line(exc: BaseException) -> str:
    """An error's message on one line (some libraries' messages span several)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "; ".join(lines) or type(exc).__name__


def orchard_leaf(error: BaseException) -> OrchardError | None:
    """The error to report for what came out of the command: the error itself when it is
    an OrchardError; for an exception group (a task group that failed, e.g. a docker image
    missing at create inside the rollout), its first leaf, when every leaf is an
    OrchardError. None means a bug: let its traceback show."""
    if isinstance(error, OrchardError):
        return error
    if isinstance(error, BaseExceptionGroup):
        matched, rest = error.split(OrchardError)
        if matched is None or rest is not None:
            return None
        first: BaseException = matched
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        return first  # type: ignore[return-value]
    return None


def report_error(error: BaseException) -> int:
    """Print the one line for a user's error; exit status 2."""
    # soft_wrap: rich would otherwise break a long message at the terminal width (80 when
    # stderr is not a terminal), and the message must stay one line.
    console.print(f"[red]error:[/] {escape(one_line(error))}", soft_wrap=True, highlight=False)
    return 2


def _interrupted(error: BaseException) -> bool:
    if isinstance(error, KeyboardInterrupt):
        return True
    return isinstance(error, BaseExceptionGroup) and error.split(KeyboardInterrupt)[0] is not None


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser(argv).parse_args(argv)
        return args.func(args)
    except BaseException as error:
        if _interrupted(error):
            console.print(
                "[yellow]interrupted[/]: every sandbox was destroyed; finished episodes are on disk (use --resume)",
                soft_wrap=True,
            )
            return 130
        if isinstance(error, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError):
            return report_error(error)  # a path the user gave, found wrong only when it was used
        leaf = orchard_leaf(error)
        if leaf is None:
            raise
        return report_error(leaf)


def console_main() -> int:
    """The `orchard-async` executable: ``main`` in a process whose collector is set for
    thousands of episodes in flight (``orchard_async.engine.collector``). Kept out of ``main``,
    which tests call in their own process, again and again."""
    tune_for_rollouts()
    return main()


if __name__ == "__main__":
    sys.exit(console_main())

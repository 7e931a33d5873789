"""`--plot FILE.png`: latency percentiles per subject and the scaling curves.

matplotlib is an optional extra (``pip install 'orchard-async[plot]'``), imported only
when a plot is asked for.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from orchard_async import ConfigError
from orchard_async.bench.report import Result, Row

PERCENTILES = [("p50_ms", "p50"), ("p90_ms", "p90"), ("p95_ms", "p95"), ("p99_ms", "p99")]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib: pip install 'orchard-async[plot]' (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_result(result: Result, path: str | Path) -> Path:
    plt = _pyplot()
    drawers = {"exec": _exec, "burst": _burst, "episodes": _episodes, "scale": _scale, "chaos": _chaos}
    drawer = {**drawers, "turnaround": _turnaround}[result.scenario]
    figure = drawer(plt, result)
    machine = result.machine
    figure.suptitle(
        f"orchard-async bench {result.scenario} · adapter {result.adapter} · {machine.get('cores')} cores, "
        f"loop {machine.get('loop')}, load {machine.get('load_avg_1m')} · {machine.get('time', '')[:16]}",
        fontsize=11,
    )
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _plain_log(plt: Any, axis: Any, which: str = "y") -> None:
    """Log scale with plain numbers (0.5, 2, 100) instead of 10^x, and no minor labels."""
    ticker = plt.matplotlib.ticker
    target = axis.yaxis if which == "y" else axis.xaxis
    target.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.10g}"))
    target.set_minor_formatter(ticker.NullFormatter())


def _levels_x(plt: Any, axis: Any, levels: list[int]) -> None:
    """A log x axis whose ticks are exactly the measured levels."""
    axis.set_xscale("log")
    axis.set_xticks(levels)
    axis.set_xticklabels([f"{level:,}" for level in levels])
    axis.xaxis.set_minor_formatter(plt.matplotlib.ticker.NullFormatter())


def _by_subject(rows: list[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        groups[row.subject].append(row)
    return {subject: sorted(items, key=lambda r: r.concurrency) for subject, items in groups.items()}


def _exec(plt: Any, result: Result) -> Any:
    figure, (lat, thr) = plt.subplots(1, 2, figsize=(13, 5.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (subject, rows) in enumerate(_by_subject(result.rows).items()):
        color = colors[index % len(colors)]
        levels = [r.concurrency for r in rows]
        lat.plot(levels, [r.p50_ms for r in rows], "o-", color=color, label=f"{subject} p50")
        lat.plot(levels, [r.p99_ms for r in rows], "s--", color=color, alpha=0.7, label=f"{subject} p99")
        thr.plot(levels, [r.ops_per_s for r in rows], "o-", color=color, label=subject)
    lat.set(
        yscale="log",
        xlabel="concurrency (command loops in flight, one sandbox each)",
        ylabel="round trip (ms, log scale)",
    )
    lat.set_title("command round trip: p50 (solid) and p99 (dashed)")
    thr.set(yscale="log", xlabel="concurrency (command loops in flight)", ylabel="commands per second (log scale)")
    thr.set_title("throughput")
    levels = sorted({r.concurrency for r in result.rows})
    for axis in (lat, thr):
        _levels_x(plt, axis, levels)
        _plain_log(plt, axis)
        axis.grid(True, which="both", alpha=0.3)
    lat.legend(fontsize=8, ncol=2, loc="lower right")
    thr.legend(fontsize=8)
    return figure


def _burst(plt: Any, result: Result) -> Any:
    figure, (lat, info) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [2.2, 1]})
    ops = [row for row in result.rows if row.operation in ("create", "exec", "destroy", "acquire")]
    width = 0.8 / len(PERCENTILES)
    for index, (field, label) in enumerate(PERCENTILES):
        xs = [i + (index - 1.5) * width for i in range(len(ops))]
        values = [getattr(row, field) or 0 for row in ops]
        bars = lat.bar(xs, values, width, label=label)
        lat.bar_label(bars, labels=[f"{v:.0f}" if v >= 10 else f"{v:.1f}" for v in values], fontsize=7, padding=2)
    lat.set_xticks(range(len(ops)))
    lat.set_xticklabels(
        [
            f"{row.subject} acquire\n(n={row.ops}, {row.concurrency} at once)"  # burst --warm: cold vs warm
            if row.operation == "acquire"
            else f"{row.operation}\n(n={row.ops}, ok {row.success_rate or 0:.1%})"
            for row in ops
        ]
    )
    lat.set(yscale="log", ylabel="latency (ms, log scale)")
    _plain_log(plt, lat)
    lat.set_title(f"per-operation latency, {result.details.get('sandboxes')} sandboxes at once")
    lat.legend()
    lat.grid(True, axis="y", which="both", alpha=0.3)
    total = next((row for row in result.rows if row.operation == "total"), None)
    info.axis("off")
    lines = [
        f"sandboxes: {result.details.get('sandboxes')}",
        f"commands each: {result.details.get('commands_per_sandbox')}",
        f"end to end: {total.wall_s if total else '-'} s",
        f"commands/s: {total.ops_per_s if total else '-'}",
        f"success: {total.success_rate:.1%}" if total and total.success_rate is not None else "success: -",
        f"lost: {result.lost}",
        f"leaked (after reap): {result.leaked}",
    ]
    info.text(0.02, 0.95, "\n".join(lines), va="top", family="monospace", fontsize=11)
    return figure


def _episodes(plt: Any, result: Result) -> Any:
    figure, (rate, share) = plt.subplots(1, 2, figsize=(13, 5.2))
    rows = sorted(result.rows, key=lambda r: r.concurrency)
    levels = [r.concurrency for r in rows]
    rate.plot(levels, [r.episodes_per_s for r in rows], "o-", label="episodes/s")
    rate.set(xlabel="concurrency (episodes in flight)", ylabel="episodes per second", ylim=(0, None))
    steps_axis = rate.twinx()
    steps_axis.plot(levels, [r.steps_per_s for r in rows], "s--", color="tab:orange", label="steps/s")
    steps_axis.set_ylabel("steps per second (commands)")
    steps_axis.set_ylim(0, None)
    _levels_x(plt, rate, levels)
    rate.set_title("rollout throughput")
    handles = rate.get_legend_handles_labels()[0] + steps_axis.get_legend_handles_labels()[0]
    rate.legend(handles, [h.get_label() for h in handles], loc="upper left")
    rate.grid(True, alpha=0.3)
    phases = [
        p
        for p in ("create", "setup", "agent", "exec", "score", "destroy")
        if any((r.time_share or {}).get(p) for r in rows)
    ]
    bottom = [0.0] * len(rows)
    positions = list(range(len(rows)))
    for phase in phases:
        values = [100 * (r.time_share or {}).get(phase, 0.0) for r in rows]
        share.bar(positions, values, 0.6, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    share.set_xticks(positions)
    share.set_xticklabels([f"conc {r.concurrency}" for r in rows])
    share.set(ylabel="share of summed episode time (%)", ylim=(0, 100))
    share.set_title("where episode time goes")
    share.legend(fontsize=8, loc="upper right")
    return figure


def _turnaround(plt: Any, result: Result) -> Any:
    figure, (latency, share) = plt.subplots(1, 2, figsize=(13, 5))
    for subject, style in (("messages", "o-"), ("tokens", "s--")):
        rows = sorted((r for r in result.rows if r.subject == subject), key=lambda r: r.concurrency)
        levels = [r.concurrency for r in rows]
        latency.plot(levels, [r.p50_ms for r in rows], style, label=f"{subject} p50")
        latency.plot(levels, [r.p99_ms for r in rows], style, alpha=0.5, label=f"{subject} p99")
        share.plot(
            levels, [100 * (r.extra or {}).get("of_ideal", 0.0) for r in rows], style, label=f"{subject}, one wave"
        )
        sustained = [v for r in rows if (v := (r.extra or {}).get("sustained_of_ideal")) is not None]
        if len(sustained) == len(rows):  # a run with --waves 1 has none
            share.plot(levels, [100 * v for v in sustained], style, alpha=0.5, label=f"{subject}, sustained")
    latency.set(xscale="log", yscale="log", xlabel="concurrent episodes", ylabel="turnaround (ms)")
    latency.set_title("model reply -> next generate request")
    share.axhline(90, color="tab:red", ls=":", label="target 90%")
    share.set(xscale="log", xlabel="concurrent episodes", ylabel="% of concurrency / engine latency", ylim=(0, 105))
    share.set_title("rollout throughput against the engine's bound")
    for axis in (latency, share):
        axis.legend()
        axis.grid(True, alpha=0.3)
    return figure


def _scale(plt: Any, result: Result) -> Any:
    figure, (rate, memory, lag) = plt.subplots(1, 3, figsize=(15, 5))
    rows = sorted(result.rows, key=lambda r: r.episodes or 0)
    episodes = [r.episodes for r in rows]
    rate.plot(episodes, [r.steps_per_s for r in rows], "o-", label="steps per wall-clock second")
    per_cpu = [(r.extra or {}).get("steps_per_cpu_s") for r in rows]
    if any(per_cpu):
        rate.plot(episodes, per_cpu, "s--", alpha=0.7, label="steps per CPU-second (what load does not skew)")
    rate.axhline(20_000, color="tab:red", ls=":", label="target 20,000 steps/s")
    rate.set(xlabel="concurrent episodes", ylabel="steps per second", ylim=(0, None))
    rate.yaxis.set_major_formatter(plt.matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    rate.set_title("engine throughput (sim, zero latency)")
    memory.plot(episodes, [r.peak_rss_mb for r in rows], "o-", color="tab:green", label="peak RSS")
    memory.axhline(1024, color="tab:red", ls=":", label="target < 1 GiB")
    memory.set(xlabel="concurrent episodes", ylabel="peak RSS (MB)", ylim=(0, None))
    memory.set_title("memory (fresh process per level)")
    lag.plot(episodes, [r.loop_lag_p99_ms for r in rows], "o-", color="tab:purple", label="p99")
    lag.plot(
        episodes,
        [(r.extra or {}).get("loop_lag_p50_ms") for r in rows],
        "s--",
        color="tab:purple",
        alpha=0.6,
        label="p50",
    )
    lag.set(xlabel="concurrent episodes", ylabel="event-loop lag (ms)", ylim=(0, None))
    lag.set_title("event-loop lag (10 ms ticker overshoot)")
    for axis in (rate, memory, lag):
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
        axis.set_xticks(episodes)
        axis.xaxis.set_major_formatter(plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / 1000:g}k"))
    return figure


def _chaos(plt: Any, result: Result) -> Any:
    figure, axis = plt.subplots(figsize=(11, 0.5 * len(result.rows) + 2))
    rows = result.rows
    labels = [row.operation or row.subject for row in rows]
    values = [row.count or 0 for row in rows]
    colors = [
        "tab:red"
        if label in ("lost", "duplicated") or label.startswith("left after reap")
        else "tab:orange"
        if label.startswith(("injected", "infrastructure"))
        else "tab:blue"
        for label in labels
    ]
    bars = axis.barh(range(len(rows)), values, color=colors)
    axis.bar_label(bars, labels=[str(row.count) if row.count is not None else "n/a" for row in rows], padding=3)
    axis.set_yticks(range(len(rows)))
    axis.set_yticklabels(labels)
    axis.invert_yaxis()
    axis.set_xlabel("count (episodes, sandboxes or processes)")
    axis.set_title(f"chaos on {result.adapter}: lost {result.lost}, leaked {result.leaked}")
    axis.grid(True, axis="x", alpha=0.3)
    return figure

"""`bench turnaround`: both paths at every level, in one run, each turn's tokens recorded on
the token path (the scenario refuses a token episode without them), and the numbers it
reports hold together."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("adapter", ["sim", "local"])
def test_turnaround_runs_both_paths_at_every_level(bench, adapter: str) -> None:
    data = bench(
        "turnaround",
        "--adapter",
        adapter,
        "--concurrency",
        "1,4",
        "--steps",
        "3",
        "--latency",
        "0.01",
        plot=adapter == "sim",
    )
    assert data["leaked"] == 0
    assert [(row["subject"], row["concurrency"]) for row in data["rows"]] == [
        ("messages", 1),
        ("tokens", 1),
        ("messages", 4),
        ("tokens", 4),
    ]
    for row in data["rows"]:
        assert row["episodes"] == row["concurrency"] and row["steps"] == 3 * row["concurrency"]
        assert row["ops"] == 2 * row["concurrency"]  # a turnaround between each two requests of an episode
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert 0 < row["extra"]["of_ideal"] <= 1.0  # never faster than the engine allows
        assert row["extra"]["ideal_steps_per_s"] == pytest.approx(row["concurrency"] / 0.01)
        assert row["extra"]["cpu_us_per_step"] > 0
    assert [(c["subject"], c["baseline"], c["concurrency"]) for c in data["comparisons"]] == [
        ("tokens", "messages", 1),
        ("tokens", "messages", 4),
    ]


def test_turnaround_refuses_a_latency_that_is_not_positive(bench) -> None:
    from orchard_async.apps.cli import main

    assert main(["bench", "turnaround", "--latency", "0"]) == 2


def test_the_steady_rate_counts_the_replies_while_every_episode_was_in_flight() -> None:
    from orchard_async.bench.turnaround import ByteTokenizer, FixedLatencyEngine

    engine = FixedLatencyEngine(0.1, ByteTokenizer())
    assert engine.steady_steps_per_s() is None  # nothing ran
    # episode 1 asks at 0.0 and replies at 0.1, 0.2, 0.3; episode 2 asks at 0.05, replies at 0.15, 0.25
    engine.first_asked = {1: 0.0, 2: 0.05}
    engine.reply_times = [0.1, 0.15, 0.2, 0.25, 0.3]
    engine.replied = {1: 0.3, 2: 0.25}
    # from 0.05 (both in flight) to 0.25 (the first one done): the replies at 0.1, 0.15, 0.2, 0.25
    assert engine.steady_steps_per_s() == pytest.approx(4 / 0.2)
    engine.replied = {1: 0.3, 2: 0.04}  # one ended before the other began: no such window
    assert engine.steady_steps_per_s() is None

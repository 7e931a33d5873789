"""`bench turnaround`: both paths at every level, in one run, each turn's tokens recorded on
the token path (the scenario refuses a token episode without them), and the numbers it
reports hold together."""

from __future__ import annotations

import anyio
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
        "--waves",
        "2",
        plot=adapter == "sim",
    )
    assert data["leaked"] == 0
    assert [(row["subject"], row["concurrency"]) for row in data["rows"]] == [
        ("floor:engine", 1),
        ("messages", 1),
        ("tokens", 1),
        ("floor:engine", 4),
        ("messages", 4),
        ("tokens", 4),
    ]
    floors = {row["concurrency"]: row for row in data["rows"] if row["subject"] == "floor:engine"}
    for floor in floors.values():  # the engine alone: its steps, never faster than its latency allows
        assert floor["episodes"] == floor["concurrency"] and floor["steps"] == 3 * floor["concurrency"]
        assert 0 < floor["extra"]["of_ideal"] <= 1.0
        assert 0 <= floor["extra"]["first_request_ms"] <= floor["extra"]["all_asked_ms"]
        assert floor["extra"]["gc_pauses"] >= 0 and floor["extra"]["gc_pause_ms"] >= 0
    for row in data["rows"]:  # each subject again, sustained: two waves of episodes per slot
        assert row["extra"]["sustained_episodes"] == 2 * row["concurrency"]
        assert 0 < row["extra"]["sustained_of_ideal"] <= 1.0
    for row in (row for row in data["rows"] if row["subject"] != "floor:engine"):
        assert row["episodes"] == row["concurrency"] and row["steps"] == 3 * row["concurrency"]
        assert row["extra"]["of_floor"] == pytest.approx(
            row["steps_per_s"] / floors[row["concurrency"]]["steps_per_s"], abs=1e-3
        )
        assert 0 < row["extra"]["first_request_ms"] <= row["extra"]["all_asked_ms"] < row["wall_s"] * 1000
        assert row["ops"] == 2 * row["concurrency"]  # a turnaround between each two requests of an episode
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert 0 < row["extra"]["of_ideal"] <= 1.0  # never faster than the engine allows
        assert row["extra"]["ideal_steps_per_s"] == pytest.approx(row["concurrency"] / 0.01)
        assert row["extra"]["cpu_us_per_step"] > 0
    assert [(c["subject"], c["baseline"], c["concurrency"]) for c in data["comparisons"]] == [
        ("tokens", "messages", 1),
        ("tokens", "messages", 4),
    ]


def test_turnaround_in_worker_processes_reports_every_workers_engine(bench) -> None:
    data = bench(
        "turnaround", "--concurrency", "1,4", "--steps", "3", "--latency", "0.01", "--waves", "2", "--processes", "2"
    )
    assert data["leaked"] == 0  # each worker's adapter, counted in its report
    rows = {(row["subject"], row["concurrency"]): row for row in data["rows"]}
    for path in ("messages", "tokens"):
        one, four = rows[(path, 1)], rows[(path, 4)]
        assert "processes" not in one["extra"] and "of_floor" in one["extra"]  # one episode: one loop
        assert four["extra"]["processes"] == 2 and "of_floor" not in four["extra"]  # the floor is one loop's
        assert four["episodes"] == 4 and four["steps"] == 12
        assert four["ops"] == 8  # both workers' engines: a turnaround between each two requests of an episode
        assert 0 < four["extra"]["first_request_ms"] <= four["extra"]["all_asked_ms"] < four["wall_s"] * 1000
        assert 0 < four["extra"]["of_ideal"] <= 1.0 and 0 < four["extra"]["sustained_of_ideal"] <= 1.0
        assert four["extra"]["cpu_us_per_step"] > 0


def test_turnaround_refuses_a_latency_that_is_not_positive(bench) -> None:
    from orchard_async.apps.cli import main

    assert main(["bench", "turnaround", "--latency", "0"]) == 2


async def test_the_steady_share_is_the_latency_over_an_episodes_mean_request_period() -> None:
    from orchard_async.bench.turnaround import ByteTokenizer, FixedLatencyEngine

    engine = FixedLatencyEngine(0.05, ByteTokenizer())
    assert engine.steady_of_ideal() is None  # nothing ran
    for _ in range(3):
        await engine._answer()
        await anyio.sleep(0.05)  # the environment's turn: as long as the engine's
    # each request came one latency plus one turn after the last: half the ideal (a loaded
    # machine only stretches the periods)
    assert 0.02 < engine.steady_of_ideal() <= 0.5 + 1e-9
    assert len(engine.periods) == 2

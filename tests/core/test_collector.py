"""The collector's settings for rollouts (orchard_async.engine.collector): what the CLI's process runs
with. The test restores the process's collector as it was."""

from __future__ import annotations

import gc

import pytest

from orchard_async import tune_for_rollouts
from orchard_async.engine.collector import ROLLOUT_THRESHOLD


@pytest.fixture
def restored_collector():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_it_raises_the_first_threshold_and_freezes_what_is_alive(restored_collector) -> None:
    gc.set_threshold(700, 10, 10)
    alive = object.__new__(type("Alive", (), {}))  # a tracked object alive at the call
    assert tune_for_rollouts() == (700, 10, 10)
    assert gc.get_threshold() == (ROLLOUT_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 0
    assert not any(obj is alive for obj in gc.get_objects())  # frozen: out of every collection's walk


def test_a_higher_threshold_is_kept(restored_collector) -> None:
    gc.set_threshold(ROLLOUT_THRESHOLD * 2, 5, 5)
    tune_for_rollouts()
    assert gc.get_threshold() == (ROLLOUT_THRESHOLD * 2, 5, 5)


def test_the_executable_tunes_its_process_and_main_does_not(restored_collector, monkeypatch, tmp_path) -> None:
    from orchard_async.apps import cli

    missing = str(tmp_path / "none.jsonl")
    gc.set_threshold(700, 10, 10)
    assert cli.main(["inspect", missing]) == 2  # tests call main in their process: left as it was
    assert gc.get_threshold()[0] == 700
    monkeypatch.setattr("sys.argv", ["orchard-async", "inspect", missing])
    assert cli.console_main() == 2
    assert gc.get_threshold()[0] == ROLLOUT_THRESHOLD

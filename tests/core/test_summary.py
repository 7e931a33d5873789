"""The run summary's pass@k and pass^k: per task group, judged episodes only."""

from __future__ import annotations

import pytest

import orchard_async as oa
from orchard_async.records.summary import summarize


def episode(task: str, sample: int, success: bool, status: str = "finished") -> oa.Trajectory:
    reason = oa.EndReason.SUBMITTED if status == "finished" else oa.EndReason.VERIFIER_ERROR
    return oa.Trajectory(
        episode_id=f"{task}/{sample}", task_id=task, group_id=f"{task}/g0", sample=sample, policy="p",
        adapter="sim", run_id="r", status=status, end_reason=reason, reward=float(success), success=success,
    )  # fmt: skip


def test_pass_at_k_and_pass_hat_k_per_task_leave_out_unjudged_episodes() -> None:
    # a: 2 of 4 pass; b: 3 of 3 judged pass (its fourth could not be judged: left out, not a failure)
    runs = [episode("a", i, i < 2) for i in range(4)]
    runs += [episode("b", i, True) for i in range(3)] + [episode("b", 3, False, status="failed")]
    summary = summarize(runs)
    assert set(summary.pass_at_k) == {"1", "2", "3"}  # up to the smallest judged group
    assert summary.pass_at_k["1"] == pytest.approx((0.5 + 1) / 2)
    assert summary.pass_at_k["3"] == pytest.approx((1 + 1) / 2)  # a: 1 - C(2,3)/C(4,3) = 1
    assert summary.pass_hat_k["2"] == pytest.approx((1 / 6 + 1) / 2, abs=1e-4)
    assert summary.pass_hat_k["3"] == pytest.approx((0 + 1) / 2)


def test_single_samples_report_no_pass_at_k() -> None:
    assert summarize([episode("a", 0, True), episode("b", 0, False)]).pass_at_k == {}


def test_a_task_sampled_thousands_of_times_reports_landmark_ks_with_exact_values() -> None:
    runs = [episode("a", i, i % 4 == 0) for i in range(2000)]  # 500 of 2000 pass
    summary = summarize(runs)
    assert list(summary.pass_at_k) == [str(k) for k in (*range(1, 17), 20, 32, 50, 64, 100, 128, 256, 2000)]
    assert summary.pass_at_k["1"] == pytest.approx(0.25) and summary.pass_hat_k["1"] == pytest.approx(0.25)
    assert summary.pass_at_k["2000"] == 1.0 and summary.pass_hat_k["2000"] == 0.0
    assert summary.pass_at_k["2"] == pytest.approx(1 - (1500 * 1499) / (2000 * 1999), abs=1e-4)

"""A smoke test per scenario on local and sim, in a small configuration: the JSON schema
and that the counts add up. Never timing asserts: this machine is shared."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter

import pytest

from orchard_async.apps.cli import main
from orchard_async.bench.compare import compare, ratios
from orchard_async.bench.report import read_json, schema_problems
from tests.bench.conftest import HAVE_MATPLOTLIB
from tests.conftest import backend_missing


def rows(data: dict, **match: object) -> list[dict]:
    return [row for row in data["rows"] if all(row.get(k) == v for k, v in match.items())]


# -- exec --------------------------------------------------------------------------------


@pytest.mark.parametrize("adapter", ["local", "sim"])
def test_exec(bench, adapter: str) -> None:
    data = bench("exec", "--adapter", adapter, "--concurrency", "1,3", "--ops", "12")
    assert data["adapter"] == adapter and data["version"] >= 2
    assert data["leaked"] == 0
    for level, per_loop in ((1, 12), (3, 5)):  # at least 5 commands per loop
        (row,) = rows(data, subject=adapter, concurrency=level)
        assert row["ops"] == level * per_loop
        assert row["errors"] == 0
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
        assert row["ops_per_s"] > 0
    floors = {row["subject"] for row in data["rows"]} - {adapter}
    if adapter == "local":
        assert floors == {"floor:spawn"}
        assert {(c["subject"], c["baseline"], c["concurrency"]) for c in data["comparisons"]} == {
            ("local", "floor:spawn", 1),
            ("local", "floor:spawn", 3),
        }
    else:
        assert floors == set()
        assert any("no floor" in note for note in data["notes"])


def test_exec_peers(bench) -> None:
    if importlib.util.find_spec("swerex") is None:  # .ci/run installs the peers extra: a failure in CI
        backend_missing("swe-rex is not installed: pip install -e '.[peers]'")
    data = bench("exec", "--adapter", "local", "--concurrency", "1,2", "--ops", "5", "--peers", plot=False)
    (peer,) = rows(data, subject="peer:swe-rex")
    assert peer["concurrency"] == 1 and peer["ops"] == 5  # measured at concurrency 1 only
    assert rows(data, subject="local:session", concurrency=1)[0]["errors"] == 0
    baselines = {(c["subject"], c["baseline"]) for c in data["comparisons"]}
    assert ("local:session", "peer:swe-rex") in baselines and ("local", "peer:swe-rex") in baselines


def test_a_scenario_draws_its_plot(bench) -> None:
    """The other scenarios draw their --plot only where matplotlib is (the plot extra)."""
    if not HAVE_MATPLOTLIB:  # .ci/run installs the plot extra: a failure in CI
        backend_missing("matplotlib is not installed, so no --plot is drawn: pip install -e '.[plot]'")
    data = bench("burst", "--adapter", "sim", "-n", "3", "-k", "1")  # the fixture checks the PNG
    assert data["lost"] == 0 and data["leaked"] == 0


# -- burst -------------------------------------------------------------------------------


@pytest.mark.parametrize("adapter", ["local", "sim"])
def test_burst(bench, adapter: str) -> None:
    data = bench("burst", "--adapter", adapter, "-n", "5", "-k", "3")
    assert data["lost"] == 0 and data["leaked"] == 0
    by_op = {row["operation"]: row for row in data["rows"]}
    assert set(by_op) == {"create", "exec", "destroy", "total"}
    assert by_op["create"]["ops"] == 5 and by_op["destroy"]["ops"] == 5
    assert by_op["exec"]["ops"] == 15
    for name in ("create", "exec", "destroy"):
        assert by_op[name]["errors"] == 0 and by_op[name]["success_rate"] == 1.0
        assert by_op[name]["p50_ms"] <= by_op[name]["p95_ms"] <= by_op[name]["p99_ms"]
    assert by_op["total"]["success_rate"] == 1.0 and by_op["total"]["ops"] == 15
    assert data["details"]["fates"] == {"ok": 5}
    assert data["details"]["leftovers"]["leaked"] == 0


def test_burst_counts_failures(bench) -> None:
    """Failed creates are counted with their reason, and still nothing is lost or leaked."""
    options = json.dumps({"create_failure_rate": 0.5, "seed": 3})
    data = bench("burst", "--adapter", "sim", "--adapter-options", options, "-n", "20", "-k", "2", plot=False)
    by_op = {row["operation"]: row for row in data["rows"]}
    failed = by_op["create"]["errors"]
    assert 0 < failed < 20
    assert by_op["create"]["extra"]["failures"] == {"CreateFailed": failed}
    assert by_op["exec"]["ops"] == (20 - failed) * 2
    assert by_op["destroy"]["ops"] == 20 - failed
    assert Counter(data["details"]["fates"]) == Counter({"ok": 20 - failed, "create_failed": failed})
    assert data["lost"] == 0 and data["leaked"] == 0


# -- episodes ----------------------------------------------------------------------------


@pytest.mark.parametrize("adapter", ["local", "sim"])
def test_episodes(bench, adapter: str) -> None:
    data = bench("episodes", "--adapter", adapter, "--concurrency", "1,3", "--episodes", "5")
    assert data["lost"] == 0 and data["leaked"] == 0
    assert [row["concurrency"] for row in data["rows"]] == [1, 3]
    for row in data["rows"]:
        assert row["episodes"] == 5 and row["steps"] > 0
        assert row["episodes_per_s"] > 0 and row["steps_per_s"] > 0
        assert sum(row["time_share"].values()) == pytest.approx(1.0, abs=0.01)
        assert set(row["time_share"]) >= {"create", "exec", "destroy"}
    if adapter == "local":  # the oracle solves every built-in task
        assert all(row["success_rate"] == 1.0 for row in data["rows"])


@pytest.mark.soak  # 20-40 s of a worker: the soak run keeps the default under 5 minutes
def test_episodes_with_fork_runs_plain_and_forked_side_by_side(bench) -> None:
    args = ["--adapter", "local", "--recipe", "swe", "--tasks", "builtin:minicalc__1", "--group-size", "2"]
    data = bench("episodes", *args, "--concurrency", "2", "--episodes", "2", "--fork")
    assert data["lost"] == 0 and data["leaked"] == 0
    assert [(row["subject"], row["episodes"]) for row in data["rows"]] == [("local", 2), ("local+fork", 2)]
    assert [row["extra"]["forked"] for row in data["rows"]] == [0, 2]
    assert all(row["success_rate"] == 1.0 for row in data["rows"])  # the oracle resolves it, forked or not
    assert data["details"]["leftovers"]["snapshots_taken"] == 1
    assert data["details"]["leftovers"]["snapshots_not_dropped"] == 0
    assert [(c["subject"], c["baseline"]) for c in data["comparisons"]] == [("local+fork", "local")]
    assert "fork" in data["details"]["adapter_doctor"]


def test_episodes_with_warm_adds_warm_runs_and_the_others_stay_cold(bench) -> None:
    args = ["--adapter", "local", "--recipe", "toy", "--concurrency", "2", "--episodes", "6", "--warm"]
    data = bench("episodes", *args)
    assert data["lost"] == 0 and data["leaked"] == 0
    cold, warm = data["rows"]
    assert (cold["subject"], warm["subject"]) == ("local", "local+warm")
    assert cold["extra"]["warm"]["hits"] == 0 and cold["extra"]["warm"]["created"] == 0
    assert warm["extra"]["warm"]["hits"] + warm["extra"]["warm"]["claimed"] > 0  # served from the pool
    assert [(c["subject"], c["baseline"]) for c in data["comparisons"]] == [("local+warm", "local")]


# -- scale -------------------------------------------------------------------------------


@pytest.mark.parametrize(("adapter", "levels"), [("sim", "40,120"), ("local", "3")])
def test_scale(bench, adapter: str, levels: str) -> None:
    data = bench("scale", "--adapter", adapter, "--levels", levels, "--steps", "3")
    assert data["leaked"] == 0
    expected = [int(level) for level in levels.split(",")]
    assert [row["episodes"] for row in data["rows"]] == expected
    for row in data["rows"]:
        assert row["concurrency"] == row["episodes"]
        assert row["steps"] == 3 * row["episodes"]
        assert row["errors"] == 0 and row["success_rate"] == 1.0
        assert row["peak_rss_mb"] > row["extra"]["baseline_rss_mb"] > 0
        assert row["steps_per_s"] > 0


# -- chaos -------------------------------------------------------------------------------


def test_chaos_sim(bench) -> None:
    options = json.dumps({"outage": [5, 15], "create_failure_rate": 0.2, "death_rate": 0.05, "exec_hang_rate": 0.05})
    data = bench(
        "chaos",
        "--adapter",
        "sim",
        "--adapter-options",
        options,
        "--episodes",
        "40",
        "--concurrency",
        "8",
        "--steps",
        "4",
    )
    assert data["lost"] == 0 and data["leaked"] == 0
    counts = {row["operation"]: row["count"] for row in data["rows"]}
    failed = sum(count for op, count in counts.items() if op.startswith("failed: "))
    assert counts["planned"] == 40
    assert counts["finished"] + failed == 40
    assert counts["lost"] == 0 and counts["duplicated"] == 0
    details = data["details"]
    assert details["faults"]["creates_failed"] > 0  # the outage alone fails 10 creates
    assert sum(details["retries"].values()) > 0


@pytest.mark.soak  # 13-20 s of whole episodes; `pytest -m soak` (CI runs both)
def test_chaos_local_sigkill(bench) -> None:
    data = bench(
        "chaos", "--adapter", "local", "--episodes", "8", "--concurrency", "2", "--steps", "3", "--rounds", "2"
    )
    assert data["lost"] == 0 and data["leaked"] == 0
    details = data["details"]
    kills = details["kills"]
    assert len(kills) == 2
    assert 0 < kills[-1]["records_at_kill"] < 8
    assert kills[-1]["records_at_kill"] + details["resumed"] == 8
    assert sum(kill["at_kill"]["sandboxes"] for kill in kills) >= 1  # killed with sandboxes live
    assert all(kill["after_reap"] == {"sandboxes": 0, "processes": 0} for kill in kills)
    counts = {row["operation"]: row["count"] for row in data["rows"]}
    assert counts["controllers SIGKILLed"] == 2 and counts["lost"] == 0 and counts["duplicated"] == 0


# -- compare, schema, bad input ----------------------------------------------------------


def test_compare(bench, capsys: pytest.CaptureFixture[str]) -> None:
    a = bench("exec", "--adapter", "sim", "--concurrency", "1,2", "--ops", "10", plot=False)
    b = bench("exec", "--adapter", "sim", "--concurrency", "2,4", "--ops", "10", plot=False)
    entries = ratios(read_json(a["_json_path"]), read_json(b["_json_path"]))
    assert {entry["key"] for entry in entries} == {("sim", "", 2)}  # only the common level
    assert {entry["metric"] for entry in entries} >= {"p50_ms", "p99_ms", "ops_per_s"}
    capsys.readouterr()
    assert main(["bench", "compare", a["_json_path"], b["_json_path"]]) == 0
    out = capsys.readouterr().out
    assert "p50 ms" in out and "1 row(s) of B have no match in A" in out
    assert compare(a["_json_path"], a["_json_path"]) == 0


def test_schema_problems() -> None:
    assert schema_problems({}) != []
    base = {
        "version": 2,
        "scenario": "burst",
        "adapter": "sim",
        "rows": [],
        "machine": {"cores": 2, "python": "3.11", "loop": "asyncio", "load_avg_1m": 0.1, "kernel": "x"},
    }
    assert any("lost" in problem for problem in schema_problems(base))
    assert schema_problems({**base, "lost": 0, "leaked": 0}) == []
    scale = {**base, "scenario": "scale", "rows": [{"subject": "sim", "concurrency": 10, "episodes": 10}]}
    assert any("steps_per_s" in problem for problem in schema_problems(scale))


def test_bad_input_is_a_clear_error(bench, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "exec", "--adapter", "nosuch", "--concurrency", "1", "--ops", "5"]) == 2
    assert "unknown adapter 'nosuch'" in capsys.readouterr().err
    assert main(["bench", "burst", "--adapter", "sim", "--adapter-options", "{not json"]) == 2
    assert "--adapter-options" in capsys.readouterr().err
    assert main(["bench", "exec", "--concurrency", "0"]) == 2  # argparse's refusal, as one line too
    assert "--concurrency: values must be positive integers" in capsys.readouterr().err


def test_markdown_and_show(bench, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "table.md"
    data = bench("burst", "--adapter", "sim", "-n", "3", "-k", "1", "--markdown", str(md), plot=False)
    text = md.read_text()
    assert "| subject | op |" in text and "| sim | create |" in text and "**lost: 0**" in text
    capsys.readouterr()
    assert main(["bench", "show", data["_json_path"], "--markdown"]) == 0
    assert capsys.readouterr().out == text
    assert main(["bench", "show", str(tmp_path / "missing.json")]) == 2

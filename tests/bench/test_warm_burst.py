"""`bench burst --warm W`: acquire latency cold and from a warm pool, in one run."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("adapter", ["local", "sim"])
def test_burst_with_a_warm_pool(bench, adapter: str) -> None:
    data = bench("burst", "--adapter", adapter, "-n", "4", "-k", "1", "--warm", "3")
    assert data["lost"] == 0 and data["leaked"] == 0
    rows = {(row["subject"], row["concurrency"]): row for row in data["rows"]}
    assert set(rows) == {
        (f"{adapter} cold", 4),
        (f"{adapter} cold", 1),
        (f"{adapter} warm 3", 1),
        (f"{adapter} warm 3", 4),
    }
    assert all(row["operation"] == "acquire" and row["errors"] == 0 for row in rows.values())
    one_by_one = rows[(f"{adapter} warm 3", 1)]
    # Three acquires one after another from a pool filled with three: each one a hand-over.
    assert one_by_one["ops"] == 3 and one_by_one["extra"]["hits"] == 3 and one_by_one["extra"]["misses"] == 0
    # The check's own round trip (a ping) beside the commands': local sandboxes have a shell, sim's do not.
    assert ("ping_p50_ms" in one_by_one["extra"]) == (adapter == "local")
    assert rows[(f"{adapter} warm 3", 4)]["ops"] == 4 and rows[(f"{adapter} cold", 4)]["ops"] == 4
    assert data["details"]["leftovers"]["leaked"] == 0

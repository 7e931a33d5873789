"""pass@k and pass^k over groups of samples of one task (the unbiased estimators).

For a task sampled ``n`` times with ``c`` passes:

* pass@k = 1 - C(n-c, k) / C(n, k): the chance that at least one of k samples passes;
* pass^k = C(c, k) / C(n, k): the chance that all k samples pass (consistency, as tau-bench
  and Claw-Eval report it).

Both are averaged over tasks, for k up to the smallest group size (every k to 16, then
landmarks, and the smallest group size itself).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    _check(n, c, k)
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k) / C(n, k) as a product: no big integers, O(c) floats (Chen et al., 2021)
    failing = 1.0
    for i in range(n - c + 1, n + 1):
        failing *= 1.0 - k / i
    return 1.0 - failing


def pass_hat_k(n: int, c: int, k: int) -> float:
    _check(n, c, k)
    # C(c, k) / C(n, k) = prod (c - i) / (n - i) for i < k
    passing = 1.0
    for i in range(k):
        passing *= (c - i) / (n - i)
        if passing == 0.0:
            break
    return passing


def _check(n: int, c: int, k: int) -> None:
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"need 0 < k <= n and 0 <= c <= n, got n={n} c={c} k={k}")


# The k reported: every k of a usual group, then a few landmarks; a task sampled 10,000 times
# is not reported at 10,000 values of k.
REPORTED_K = (*range(1, 17), 20, 32, 50, 64, 100, 128, 256)


def summarize_groups(trajectories: Iterable[Any]) -> dict[str, Any]:
    """``pass_at_k`` and ``pass_hat_k`` (k -> mean over tasks) of finished episodes, grouped by
    task. Episodes nobody could judge (failed: verifier errors, infrastructure) are left out,
    never counted as failures."""
    outcomes: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories:
        if t.status == "finished":
            outcomes[t.task_id].append(bool(t.success))
    if not outcomes:
        return {"tasks": 0, "group_size": 0, "pass_at_k": {}, "pass_hat_k": {}}
    smallest = min(len(v) for v in outcomes.values())
    at, hat = {}, {}
    for k in [k for k in REPORTED_K if k < smallest] + [smallest]:
        at[k] = sum(pass_at_k(len(v), sum(v), k) for v in outcomes.values()) / len(outcomes)
        hat[k] = sum(pass_hat_k(len(v), sum(v), k) for v in outcomes.values()) / len(outcomes)
    return {"tasks": len(outcomes), "group_size": smallest, "pass_at_k": at, "pass_hat_k": hat}

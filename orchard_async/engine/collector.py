"""The garbage collector's settings for a process that drives many episodes at once.

An episode in flight holds about 60 objects the collector tracks (its coroutines' frames, cancel
scopes, timer handles, the sandbox's and the task's records; 72 before 2026-12-05's cuts), so
1,024 of them are ~62,000 live objects. CPython's default first threshold (700 allocations)
starts a young collection every few steps of such a rollout, and every tenth of those an older
one, each walking the whole in-flight set and finding nothing: these episodes make almost no
cycles. On the sim adapter at 1,024 episodes that was a fifth of the process's CPU and pauses
of 20-50 ms on the one event loop (`bench turnaround`, docs/performance.md).

``tune_for_rollouts`` is what the CLI calls once at start; an embedding trainer may call it
too (the collector is the process's, so it is the application's choice, never done behind a
``rollout`` call)."""

from __future__ import annotations

import gc

# Young collections every 50,000 net allocations, not 700: at most a few MB of cyclic garbage
# waits a little longer, and a rollout's in-flight set is walked a few times a second, not
# hundreds. The older generations keep their default ratios.
ROLLOUT_THRESHOLD = 50_000


def tune_for_rollouts(threshold: int = ROLLOUT_THRESHOLD) -> tuple[int, int, int]:
    """Move everything alive now (modules, classes, the loaded packages: never garbage) out of
    the collector's sight (``gc.freeze``) and raise its first threshold to ``threshold`` if it
    is lower. Returns the thresholds it replaced. Call it after imports, before the run."""
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    if previous[0] < threshold:
        gc.set_threshold(threshold, *previous[1:])
    return previous

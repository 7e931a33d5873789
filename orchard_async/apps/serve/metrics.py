"""``/metrics`` in Prometheus's text format: a few counters, one gauge, one histogram.

Written by hand: five series do not need a client library. Labels are tenant names and
fixed reasons, never keys or paths (their number stays small and nothing secret shows).
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable

EXEC_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Metrics:
    def __init__(self, live_sandboxes: Callable[[], dict[str, int]]):
        self._live = live_sandboxes  # read at scrape time: the registry is the truth
        self.creates: collections.Counter[str] = collections.Counter()
        self.deletes: collections.Counter[tuple[str, str]] = collections.Counter()  # (tenant, why)
        self.errors: collections.Counter[str] = collections.Counter()
        self._exec_counts = [0] * (len(EXEC_BUCKETS) + 1)
        self._exec_sum = 0.0

    def observe_exec(self, seconds: float) -> None:
        self._exec_counts[bisect.bisect_left(EXEC_BUCKETS, seconds)] += 1
        self._exec_sum += seconds

    def render(self) -> str:
        lines = [
            "# HELP orchard_serve_live_sandboxes Sandboxes pending or ready, per key.",
            "# TYPE orchard_serve_live_sandboxes gauge",
        ]
        lines += [f'orchard_serve_live_sandboxes{{key="{k}"}} {v}' for k, v in sorted(self._live().items())]
        lines += [
            "# HELP orchard_serve_creates_total Sandboxes created, per key.",
            "# TYPE orchard_serve_creates_total counter",
        ]
        lines += [f'orchard_serve_creates_total{{key="{k}"}} {v}' for k, v in sorted(self.creates.items())]
        lines += [
            "# HELP orchard_serve_deletes_total Sandboxes removed, per key and why (deleted, ttl, idle).",
            "# TYPE orchard_serve_deletes_total counter",
        ]
        lines += [
            f'orchard_serve_deletes_total{{key="{k}",reason="{why}"}} {v}'
            for (k, why), v in sorted(self.deletes.items())
        ]
        lines += [
            "# HELP orchard_serve_errors_total Error answers and failures, by reason.",
            "# TYPE orchard_serve_errors_total counter",
        ]
        lines += [f'orchard_serve_errors_total{{reason="{k}"}} {v}' for k, v in sorted(self.errors.items())]
        lines += [
            "# HELP orchard_serve_exec_seconds Command run time as the service saw it.",
            "# TYPE orchard_serve_exec_seconds histogram",
        ]
        cumulative = 0
        for bound, count in zip(EXEC_BUCKETS, self._exec_counts, strict=False):
            cumulative += count
            lines.append(f'orchard_serve_exec_seconds_bucket{{le="{bound}"}} {cumulative}')
        cumulative += self._exec_counts[-1]
        lines.append(f'orchard_serve_exec_seconds_bucket{{le="+Inf"}} {cumulative}')
        lines.append(f"orchard_serve_exec_seconds_sum {self._exec_sum}")
        lines.append(f"orchard_serve_exec_seconds_count {cumulative}")
        return "\n".join(lines) + "\n"

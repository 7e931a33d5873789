"""The create deadline an adapter gives itself so that it can say why a create is slow.

The pool owns the create timeout (a cancel scope around ``adapter.create``). An adapter that
knows why a sandbox is not ready yet (an unschedulable pod, an image still pulling) reads the
caller's deadline here and fails a little before it with its own ``CreateFailed``.
"""

from __future__ import annotations

import anyio

EXPLAIN_MARGIN = 2.0  # seconds at most that an adapter keeps, before its caller's deadline, to explain a slow create


def explained_deadline() -> tuple[float, float]:
    """For an adapter's ``create``: (the deadline to give itself, the caller's budget in
    seconds from now). The deadline is the caller's (the pool's create timeout, or any
    scope around the call) less a little time, so that the adapter's own CreateFailed,
    which says why the sandbox is not ready, wins over the caller's bare cancellation; both
    are infinite when the caller set none."""
    deadline = anyio.current_effective_deadline()
    budget = deadline - anyio.current_time()
    return deadline - min(EXPLAIN_MARGIN, 0.1 * budget), budget

"""One retry policy for every loop that tries again: ``Backoff`` (exponential, capped, with
jitter), ``Attempts`` (one call's tries under a count and a deadline), and the one reader of
an HTTP ``Retry-After`` header.

Not tenacity or stamina: the loops here take the pause a server asked for (Retry-After) in
place of the backoff's, give up *before* a pause that would end past their deadline and say
which limit ended them, and some pace work that is not one call (the pool's creates, a
watch's reconnects, deletion sweeps); their jitter is a factor on the capped delay, where
both libraries add it. The caller sleeps (``anyio.sleep``), so cancel scopes apply as to
any other wait.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import anyio

# Past this many doublings any cap has been reached; 2**1024 would not fit in a float.
_MAX_DOUBLINGS = 64


@dataclass(frozen=True)
class Backoff:
    """``min(cap, first * 2**failures) * uniform(*jitter)`` seconds after ``failures``
    earlier failures: ``first`` before the first retry, doubling up to ``cap``."""

    first: float
    cap: float = math.inf
    jitter: tuple[float, float] = (1.0, 1.0)  # the factor's range; (1, 1) draws nothing

    def delay(self, failures: int) -> float:
        pause = min(self.cap, self.first * 2 ** min(failures, _MAX_DOUBLINGS))
        low, high = self.jitter
        return pause if low == high == 1.0 else pause * random.uniform(low, high)


class Attempts:
    """The pacing of one call's tries: at most ``most`` of them (None: no count), none after
    ``deadline`` (on ``clock``; None: no deadline), ``backoff`` between them unless the
    server said how long to wait.

    After each failed try ``next_pause`` gives the pause before the next, or None when there
    is none: then ``out_of_time`` tells whether the deadline or the count ended them."""

    def __init__(
        self,
        backoff: Backoff,
        *,
        most: int | None = None,
        deadline: float | None = None,
        clock: Callable[[], float] = anyio.current_time,
    ):
        self.backoff = backoff
        self.most = most
        self.deadline = deadline
        self.clock = clock
        self.failures = 0  # failed tries so far
        self.out_of_time = False

    def time_left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - self.clock()

    def fits(self, pause: float) -> bool:
        """Would a try after waiting ``pause`` seconds start before the deadline?"""
        return self.deadline is None or self.clock() + pause <= self.deadline

    def next_pause(self, asked: float | None = None) -> float | None:
        """Count a failed try; the pause before the next one (``asked``, what the server said,
        else the backoff's), or None when no try is left."""
        self.failures += 1
        if self.most is not None and self.failures >= self.most:
            return None
        pause = self.backoff.delay(self.failures - 1) if asked is None else asked
        if not self.fits(pause):
            self.out_of_time = True
            return None
        return pause


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (a number or an HTTP date; never negative), None
    when it is missing or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None

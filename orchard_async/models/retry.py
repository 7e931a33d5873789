"""One reading of an HTTP ``Retry-After`` header for every client that retries."""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (a number or an HTTP date)."""
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

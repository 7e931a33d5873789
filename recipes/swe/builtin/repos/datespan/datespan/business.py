"""Working-day arithmetic."""

from datetime import timedelta

SATURDAY = 5
SUNDAY = 6


def business_days(span, holidays=(), weekend=(SATURDAY, SUNDAY)):
    """Count the working days in ``span`` (both ends inclusive).

    A working day is any day whose ``weekday()`` is not in ``weekend`` and
    that is not listed in ``holidays``.
    """
    weekend = frozenset(weekend)
    full_weeks, extra_days = divmod(span.days, 7)
    count = full_weeks * (7 - len(weekend))
    first_extra = span.start + timedelta(days=full_weeks * 7)
    for offset in range(extra_days):
        day = first_extra + timedelta(days=offset)
        if day.weekday() not in weekend:
            count += 1
    for holiday in set(holidays):
        if holiday in span:
            count -= 1
    return count

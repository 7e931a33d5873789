"""Calendar arithmetic helpers (proleptic Gregorian calendar)."""

from datetime import date

_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_leap_year(year):
    """Return True if ``year`` is a Gregorian leap year."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    """Return the number of days in ``month`` (1-12) of ``year``."""
    if not 1 <= month <= 12:
        raise ValueError(f"month must be in 1..12, got {month}")
    if month == 2 and is_leap_year(year):
        return 29
    return _DAYS_IN_MONTH[month - 1]


def month_end(d):
    """Return the last day of the month containing ``d``."""
    return d.replace(day=days_in_month(d.year, d.month))


def add_months(d, months):
    """Return ``d`` shifted by ``months`` calendar months (may be negative).

    If the resulting month is shorter than ``d.day`` the day is clamped to the
    last day of that month, e.g. ``add_months(date(2023, 1, 31), 1)`` is
    ``date(2023, 2, 28)``.
    """
    index = d.year * 12 + (d.month - 1) + months
    year, month0 = divmod(index, 12)
    month = month0 + 1
    day = min(d.day, days_in_month(d.year, d.month))
    return date(year, month, day)

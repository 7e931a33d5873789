"""Text forms of spans."""

import re
from datetime import date

from .calendar_utils import days_in_month
from .span import DateSpan

_YEAR = re.compile(r"(\d{4})")
_MONTH = re.compile(r"(\d{4})-(\d{2})")


def parse_date(text):
    """Parse an ISO ``YYYY-MM-DD`` date, raising ``ValueError`` on bad input."""
    text = text.strip()
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        raise ValueError(f"invalid date {text!r}: expected YYYY-MM-DD")
    return date.fromisoformat(text)


def parse_span(text):
    """Parse a span from one of its text forms.

    * ``"2024-01-05..2024-02-10"`` - explicit inclusive range
    * ``"2024-01-05"`` - a single day
    * ``"2024-02"`` - a whole month
    * ``"2024"`` - a whole year
    """
    text = text.strip()
    if ".." in text:
        start_text, end_text = text.split("..", 1)
        return DateSpan(parse_date(start_text), parse_date(end_text))
    match = _MONTH.fullmatch(text)
    if match:
        year, month = int(match.group(1)), int(match.group(2))
        if not 1 <= month <= 12:
            raise ValueError(f"invalid month in {text!r}")
        return DateSpan(date(year, month, 1), date(year, month, days_in_month(year, month)))
    match = _YEAR.fullmatch(text)
    if match:
        year = int(match.group(1))
        return DateSpan(date(year, 1, 1), date(year, 12, 31))
    day = parse_date(text)
    return DateSpan(day, day)


def format_span(span):
    """Format ``span`` using the most compact text form.

    The result always round-trips: ``parse_span(format_span(s)) == s``.
    """
    start, end = span.start, span.end
    if start.month == 1 and start.day == 1 and end.month == 12 and end.day == 31:
        if start.year == end.year:
            return f"{start.year:04d}"
    if start.day == 1 and end.day == days_in_month(end.year, end.month):
        return f"{start.year:04d}-{start.month:02d}"
    if start == end:
        return start.isoformat()
    return str(span)

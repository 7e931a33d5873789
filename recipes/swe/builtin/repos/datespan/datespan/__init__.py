"""datespan - inclusive calendar date ranges."""

from .business import business_days
from .calendar_utils import add_months, days_in_month, is_leap_year, month_end
from .ops import gaps, merge_spans, total_days
from .parsing import format_span, parse_date, parse_span
from .span import DateSpan

__all__ = [
    "DateSpan",
    "add_months",
    "business_days",
    "days_in_month",
    "format_span",
    "gaps",
    "is_leap_year",
    "merge_spans",
    "month_end",
    "parse_date",
    "parse_span",
    "total_days",
]

__version__ = "0.9.0"

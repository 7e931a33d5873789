from datetime import date

import pytest

from datespan import DateSpan, business_days


def span(a, b):
    return DateSpan(date.fromisoformat(a), date.fromisoformat(b))


def test_full_week():
    # Monday 2024-06-03 .. Sunday 2024-06-09
    assert business_days(span("2024-06-03", "2024-06-09")) == 5


def test_weekend_only():
    assert business_days(span("2024-06-08", "2024-06-09")) == 0


def test_partial_weeks():
    # Thursday .. Tuesday: Thu, Fri, Mon, Tue
    assert business_days(span("2024-06-06", "2024-06-11")) == 4


@pytest.mark.parametrize("month, expected", [("2024-01", 23), ("2024-02", 21), ("2024-06", 20)])
def test_whole_months(month, expected):
    year, m = map(int, month.split("-"))
    first = date(year, m, 1)
    last = date(year + (m == 12), m % 12 + 1, 1).toordinal() - 1
    assert business_days(DateSpan(first, date.fromordinal(last))) == expected


def test_weekday_holiday_is_excluded():
    july = span("2024-07-01", "2024-07-31")
    assert business_days(july, holidays=[date(2024, 7, 4)]) == 22


def test_holidays_outside_span_are_ignored():
    assert business_days(span("2024-06-03", "2024-06-07"), holidays=[date(2024, 12, 25)]) == 5


def test_duplicate_holidays_counted_once():
    week = span("2024-06-03", "2024-06-09")
    assert business_days(week, holidays=[date(2024, 6, 5), date(2024, 6, 5)]) == 4


def test_custom_weekend():
    # Friday/Saturday weekend
    assert business_days(span("2024-06-03", "2024-06-09"), weekend=(4, 5)) == 5
    assert business_days(span("2024-06-07", "2024-06-08"), weekend=(4, 5)) == 0

from datetime import date

import pytest

from datespan import DateSpan, format_span, parse_date, parse_span


def span(a, b):
    return DateSpan(date.fromisoformat(a), date.fromisoformat(b))


def test_parse_date():
    assert parse_date(" 2024-02-29 ") == date(2024, 2, 29)


@pytest.mark.parametrize("text", ["2024-2-29", "20240229", "2023-02-29", "yesterday"])
def test_parse_date_rejects_invalid(text):
    with pytest.raises(ValueError):
        parse_date(text)


def test_parse_explicit_range():
    assert parse_span("2024-01-05..2024-02-10") == span("2024-01-05", "2024-02-10")
    assert parse_span("2024-01-05 .. 2024-02-10") == span("2024-01-05", "2024-02-10")


def test_parse_single_day():
    assert parse_span("2024-07-04") == span("2024-07-04", "2024-07-04")


def test_parse_month():
    assert parse_span("2024-02") == span("2024-02-01", "2024-02-29")
    assert parse_span("2023-02") == span("2023-02-01", "2023-02-28")


def test_parse_year():
    assert parse_span("2024") == span("2024-01-01", "2024-12-31")


@pytest.mark.parametrize("text", ["2024-13", "2024-05-01..", "..2024-05-01", "2024-06-02..2024-06-01"])
def test_parse_span_rejects_invalid(text):
    with pytest.raises(ValueError):
        parse_span(text)


@pytest.mark.parametrize(
    "value, expected",
    [
        (("2024-01-01", "2024-12-31"), "2024"),
        (("2024-02-01", "2024-02-29"), "2024-02"),
        (("2024-07-04", "2024-07-04"), "2024-07-04"),
        (("2024-01-05", "2024-02-10"), "2024-01-05..2024-02-10"),
    ],
)
def test_format_span(value, expected):
    assert format_span(span(*value)) == expected


def test_round_trip_of_partial_month():
    s = span("2024-03-02", "2024-03-31")
    assert parse_span(format_span(s)) == s

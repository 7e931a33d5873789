from datetime import date, datetime

import pytest

from datespan import DateSpan


def span(a, b):
    return DateSpan(date.fromisoformat(a), date.fromisoformat(b))


def test_days_are_inclusive():
    assert span("2024-01-01", "2024-01-31").days == 31
    assert len(span("2024-02-01", "2024-02-29")) == 29
    assert DateSpan.single(date(2024, 5, 5)).days == 1


def test_end_before_start_rejected():
    with pytest.raises(ValueError):
        span("2024-02-02", "2024-02-01")


def test_datetimes_rejected():
    with pytest.raises(TypeError):
        DateSpan(datetime(2024, 1, 1), date(2024, 1, 2))


def test_contains():
    s = span("2024-03-10", "2024-03-20")
    assert date(2024, 3, 10) in s
    assert date(2024, 3, 20) in s
    assert date(2024, 3, 21) not in s


def test_iteration():
    days = list(span("2024-02-27", "2024-03-01"))
    assert days == [date(2024, 2, 27), date(2024, 2, 28), date(2024, 2, 29), date(2024, 3, 1)]


def test_str():
    assert str(span("2024-01-05", "2024-02-10")) == "2024-01-05..2024-02-10"


def test_overlapping_spans():
    a = span("2024-01-01", "2024-01-10")
    b = span("2024-01-05", "2024-01-20")
    assert a.overlaps(b)
    assert b.overlaps(a)


def test_contained_span_overlaps():
    assert span("2024-01-01", "2024-12-31").overlaps(span("2024-06-01", "2024-06-30"))


def test_disjoint_spans_do_not_overlap():
    a = span("2024-01-01", "2024-01-10")
    b = span("2024-01-11", "2024-01-20")
    assert not a.overlaps(b)
    assert not b.overlaps(a)


def test_intersection():
    a = span("2024-01-01", "2024-01-10")
    b = span("2024-01-05", "2024-01-20")
    assert a.intersection(b) == span("2024-01-05", "2024-01-10")
    assert a.intersection(span("2024-02-01", "2024-02-02")) is None


def test_is_adjacent():
    a = span("2024-01-01", "2024-01-10")
    assert a.is_adjacent(span("2024-01-11", "2024-01-12"))
    assert span("2023-12-01", "2023-12-31").is_adjacent(a)
    assert not a.is_adjacent(span("2024-01-12", "2024-01-13"))


def test_shift():
    assert span("2024-02-28", "2024-03-01").shift(2) == span("2024-03-01", "2024-03-03")
    assert span("2024-01-01", "2024-01-01").shift(-1) == span("2023-12-31", "2023-12-31")


def test_split_by_month():
    pieces = span("2024-01-15", "2024-03-10").split_by_month()
    assert pieces == [
        span("2024-01-15", "2024-01-31"),
        span("2024-02-01", "2024-02-29"),
        span("2024-03-01", "2024-03-10"),
    ]


def test_split_by_month_across_year_end():
    pieces = span("2023-12-20", "2024-01-05").split_by_month()
    assert pieces == [span("2023-12-20", "2023-12-31"), span("2024-01-01", "2024-01-05")]


def test_split_within_single_month():
    s = span("2024-04-03", "2024-04-09")
    assert s.split_by_month() == [s]


def test_ordering():
    spans = [span("2024-03-01", "2024-03-02"), span("2024-01-01", "2024-01-05")]
    assert sorted(spans)[0].start == date(2024, 1, 1)

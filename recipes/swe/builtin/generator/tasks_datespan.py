TASKS = []

TASKS.append(
    dict(
        repo="datespan",
        problem_statement="""`DateSpan.overlaps()` is False for spans that share a single day

Spans are inclusive at both ends, but `overlaps()` ignores the shared boundary day:

```python
>>> from datetime import date
>>> from datespan import DateSpan, parse_span
>>> a = parse_span("2024-01-01..2024-01-10")
>>> b = parse_span("2024-01-10..2024-01-20")
>>> a.overlaps(b)
False
>>> a.intersection(b)
DateSpan(start=datetime.date(2024, 1, 10), end=datetime.date(2024, 1, 10))
>>> d = DateSpan.single(date(2024, 2, 29))
>>> d.overlaps(d)
False
```

Our booking code uses `overlaps()` to reject double bookings, so a reservation ending on Jan 10 and one starting on Jan 10 were both accepted.

Expected: `overlaps()` is True whenever the spans have at least one day in common, i.e. it agrees with `intersection(...) is not None`. Spans that only touch (Jan 1-10 and Jan 11-20) have no day in common and must still not overlap.
""",
        gold=[
            (
                "replace",
                "datespan/span.py",
                """        return self.start < other.end and other.start < self.end
""",
                """        return self.start <= other.end and other.start <= self.end
""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_span.py",
                """

def test_spans_sharing_one_day_overlap():
    a = span("2024-01-01", "2024-01-10")
    b = span("2024-01-10", "2024-01-20")
    assert a.overlaps(b)
    assert b.overlaps(a)


def test_single_day_spans_overlap():
    d = DateSpan.single(date(2024, 2, 29))
    assert d.overlaps(d)
    assert d.overlaps(span("2024-02-01", "2024-02-29"))
    assert not d.overlaps(span("2024-03-01", "2024-03-31"))


def test_overlaps_agrees_with_intersection():
    spans = [
        span("2024-01-01", "2024-01-10"),
        span("2024-01-10", "2024-01-20"),
        span("2024-01-11", "2024-01-11"),
        span("2024-01-05", "2024-01-05"),
        span("2023-12-01", "2024-02-01"),
        span("2024-01-21", "2024-01-31"),
    ]
    for a in spans:
        for b in spans:
            assert a.overlaps(b) == (a.intersection(b) is not None), (str(a), str(b))
""",
            )
        ],
        expect_f2p=[
            "tests/test_span.py::test_spans_sharing_one_day_overlap",
            "tests/test_span.py::test_single_day_spans_overlap",
            "tests/test_span.py::test_overlaps_agrees_with_intersection",
        ],
    )
)

TASKS.append(
    dict(
        repo="datespan",
        problem_statement="""`merge_spans()` does not merge adjacent spans

The README and the `merge_spans` docstring say that spans which overlap *or touch* are merged, but spans where one ends the day before the next starts are returned separately:

```python
>>> from datespan import merge_spans, parse_span
>>> merged = merge_spans([parse_span("2024-01-01..2024-01-10"), parse_span("2024-01-11..2024-01-20")])
>>> [str(s) for s in merged]
['2024-01-01..2024-01-10', '2024-01-11..2024-01-20']
>>> [str(s) for s in merge_spans([parse_span("2024-02"), parse_span("2024-01"), parse_span("2024-03")])]
['2024-01-01..2024-01-31', '2024-02-01..2024-02-29', '2024-03-01..2024-03-31']
```

Expected `['2024-01-01..2024-01-20']` and `['2024-01-01..2024-03-31']`. After merging, no two spans in the result should overlap or be adjacent. Spans separated by at least one uncovered day must stay separate.
""",
        gold=[
            (
                "replace",
                "datespan/ops.py",
                """        if merged and span.start <= merged[-1].end:
""",
                """        if merged and span.start <= merged[-1].end + ONE_DAY:
""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_ops.py",
                """

def test_merge_adjacent_spans():
    spans = [span("2024-01-11", "2024-01-20"), span("2024-01-01", "2024-01-10")]
    assert merge_spans(spans) == [span("2024-01-01", "2024-01-20")]


def test_merge_consecutive_months():
    spans = [
        span("2024-02-01", "2024-02-29"),
        span("2024-01-01", "2024-01-31"),
        span("2024-03-01", "2024-03-31"),
    ]
    assert merge_spans(spans) == [span("2024-01-01", "2024-03-31")]


def test_merge_keeps_spans_separated_by_one_day():
    spans = [span("2024-01-01", "2024-01-10"), span("2024-01-12", "2024-01-20")]
    assert merge_spans(spans) == spans


def test_merged_result_has_no_adjacent_spans():
    spans = [span("2024-01-01", "2024-01-03"), span("2024-01-04", "2024-01-04"), span("2024-01-06", "2024-01-09")]
    merged = merge_spans(spans)
    assert merged == [span("2024-01-01", "2024-01-04"), span("2024-01-06", "2024-01-09")]
    for a, b in zip(merged, merged[1:]):
        assert not a.is_adjacent(b)
""",
            )
        ],
        expect_f2p=[
            "tests/test_ops.py::test_merge_adjacent_spans",
            "tests/test_ops.py::test_merge_consecutive_months",
            "tests/test_ops.py::test_merged_result_has_no_adjacent_spans",
        ],
    )
)

TASKS.append(
    dict(
        repo="datespan",
        problem_statement="""`add_months()` raises ValueError for dates near the end of a month

`add_months` is documented to clamp the day to the last day of the target month (`add_months(date(2023, 1, 31), 1)` should be `date(2023, 2, 28)`), but instead it crashes:

```python
>>> from datetime import date
>>> from datespan import add_months
>>> add_months(date(2023, 1, 31), 1)
Traceback (most recent call last):
  ...
ValueError: day is out of range for month
>>> add_months(date(2024, 3, 31), -1)
Traceback (most recent call last):
  ...
ValueError: day is out of range for month
```

This breaks our month-end billing schedule. Expected `date(2023, 2, 28)` and `date(2024, 2, 29)`; similarly `add_months(date(2024, 5, 31), 1) == date(2024, 6, 30)` and `add_months(date(2024, 2, 29), 12) == date(2025, 2, 28)`. Dates whose day exists in the target month must be unaffected.
""",
        gold=[
            (
                "replace",
                "datespan/calendar_utils.py",
                """    day = min(d.day, days_in_month(d.year, d.month))
""",
                """    day = min(d.day, days_in_month(year, month))
""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_calendar.py",
                """

@pytest.mark.parametrize(
    "start, months, expected",
    [
        (date(2024, 1, 31), 1, date(2024, 2, 29)),
        (date(2023, 1, 31), 1, date(2023, 2, 28)),
        (date(2024, 3, 31), -1, date(2024, 2, 29)),
        (date(2024, 5, 31), 1, date(2024, 6, 30)),
        (date(2024, 2, 29), 12, date(2025, 2, 28)),
        (date(2024, 8, 31), 3, date(2024, 11, 30)),
    ],
    ids=["leap-february", "common-february", "backwards", "thirty-day-month", "leap-day-next-year", "across-quarter"],
)
def test_add_months_clamps_to_month_end(start, months, expected):
    assert add_months(start, months) == expected
""",
            )
        ],
        expect_f2p=[
            "tests/test_calendar.py::test_add_months_clamps_to_month_end[leap-february]",
            "tests/test_calendar.py::test_add_months_clamps_to_month_end[common-february]",
            "tests/test_calendar.py::test_add_months_clamps_to_month_end[backwards]",
            "tests/test_calendar.py::test_add_months_clamps_to_month_end[thirty-day-month]",
            "tests/test_calendar.py::test_add_months_clamps_to_month_end[leap-day-next-year]",
            "tests/test_calendar.py::test_add_months_clamps_to_month_end[across-quarter]",
        ],
    )
)

TASKS.append(
    dict(
        repo="datespan",
        problem_statement="""`business_days()` subtracts holidays that fall on a weekend

A holiday that falls on a weekend day is subtracted even though that day was never counted as a working day:

```python
>>> from datetime import date
>>> from datespan import business_days, parse_span
>>> december = parse_span("2021-12")
>>> business_days(december)
23
>>> business_days(december, holidays=[date(2021, 12, 25)])   # Christmas 2021 is a Saturday
22
```

Expected `23` for the second call as well. The same applies with a custom `weekend`: with `weekend=(4, 5)` (Friday/Saturday) a holiday on a Friday must not reduce the count. Holidays on working days are subtracted as before.
""",
        gold=[
            (
                "replace",
                "datespan/business.py",
                """        if holiday in span:
""",
                """        if holiday in span and holiday.weekday() not in weekend:
""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_business.py",
                """

def test_weekend_holiday_is_not_subtracted():
    december = span("2021-12-01", "2021-12-31")
    assert business_days(december) == 23
    assert business_days(december, holidays=[date(2021, 12, 25)]) == 23
    assert business_days(december, holidays=[date(2021, 12, 24), date(2021, 12, 25)]) == 22


def test_holiday_on_custom_weekend_is_not_subtracted():
    # Friday/Saturday weekend; 2024-06-07 is a Friday
    week = span("2024-06-03", "2024-06-09")
    assert business_days(week, holidays=[date(2024, 6, 7)], weekend=(4, 5)) == 5
    assert business_days(week, holidays=[date(2024, 6, 9)], weekend=(4, 5)) == 4
""",
            )
        ],
        expect_f2p=[
            "tests/test_business.py::test_weekend_holiday_is_not_subtracted",
            "tests/test_business.py::test_holiday_on_custom_weekend_is_not_subtracted",
        ],
    )
)

TASKS.append(
    dict(
        repo="datespan",
        problem_statement="""`format_span()` collapses multi-month spans into a single month

`format_span` documents that its output always round-trips through `parse_span`, but spans that start on the first of one month and end on the last day of a *later* month are formatted as just the first month:

```python
>>> from datespan import format_span, parse_span
>>> q1 = parse_span("2024-01-01..2024-03-31")
>>> format_span(q1)
'2024-01'
>>> parse_span(format_span(q1)) == q1
False
>>> format_span(parse_span("2023-01-01..2024-12-31"))
'2023-01'
```

Expected `'2024-01-01..2024-03-31'` and `'2023-01-01..2024-12-31'` (and in general `parse_span(format_span(s)) == s`). Whole single months (`'2024-02'`) and whole single years (`'2024'`) should keep their compact forms.
""",
        gold=[
            (
                "replace",
                "datespan/parsing.py",
                """    if start.day == 1 and end.day == days_in_month(end.year, end.month):
        return f"{start.year:04d}-{start.month:02d}"
""",
                """    same_month = (start.year, start.month) == (end.year, end.month)
    if same_month and start.day == 1 and end.day == days_in_month(end.year, end.month):
        return f"{start.year:04d}-{start.month:02d}"
""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_parsing.py",
                """

@pytest.mark.parametrize(
    "value, expected",
    [
        (("2024-01-01", "2024-03-31"), "2024-01-01..2024-03-31"),
        (("2023-11-01", "2024-02-29"), "2023-11-01..2024-02-29"),
        (("2023-01-01", "2024-12-31"), "2023-01-01..2024-12-31"),
    ],
    ids=["quarter", "across-year-end", "two-whole-years"],
)
def test_format_multi_month_spans(value, expected):
    assert format_span(span(*value)) == expected


def test_round_trip_of_month_aligned_spans():
    for start, end in [
        ("2024-01-01", "2024-01-31"),
        ("2024-01-01", "2024-02-29"),
        ("2024-01-01", "2024-12-31"),
        ("2022-07-01", "2024-06-30"),
    ]:
        s = span(start, end)
        assert parse_span(format_span(s)) == s, str(s)
""",
            )
        ],
        expect_f2p=[
            "tests/test_parsing.py::test_format_multi_month_spans[quarter]",
            "tests/test_parsing.py::test_format_multi_month_spans[across-year-end]",
            "tests/test_parsing.py::test_format_multi_month_spans[two-whole-years]",
            "tests/test_parsing.py::test_round_trip_of_month_aligned_spans",
        ],
    )
)

from datetime import date

from datespan import DateSpan, gaps, merge_spans, total_days


def span(a, b):
    return DateSpan(date.fromisoformat(a), date.fromisoformat(b))


def test_merge_overlapping():
    spans = [span("2024-01-05", "2024-01-20"), span("2024-01-01", "2024-01-10")]
    assert merge_spans(spans) == [span("2024-01-01", "2024-01-20")]


def test_merge_keeps_separate_spans_sorted():
    spans = [span("2024-03-01", "2024-03-05"), span("2024-01-01", "2024-01-05")]
    assert merge_spans(spans) == [span("2024-01-01", "2024-01-05"), span("2024-03-01", "2024-03-05")]


def test_merge_contained_span():
    spans = [span("2024-01-01", "2024-01-31"), span("2024-01-10", "2024-01-12")]
    assert merge_spans(spans) == [span("2024-01-01", "2024-01-31")]


def test_merge_empty():
    assert merge_spans([]) == []


def test_merge_does_not_mutate_input():
    spans = [span("2024-01-05", "2024-01-20"), span("2024-01-01", "2024-01-10")]
    original = list(spans)
    merge_spans(spans)
    assert spans == original


def test_total_days_counts_overlap_once():
    spans = [span("2024-01-01", "2024-01-10"), span("2024-01-06", "2024-01-15")]
    assert total_days(spans) == 15


def test_gaps_between_spans():
    spans = [span("2024-01-01", "2024-01-05"), span("2024-01-10", "2024-01-12")]
    assert gaps(spans) == [span("2024-01-06", "2024-01-09")]


def test_gaps_within_window():
    spans = [span("2024-01-05", "2024-01-06")]
    window = span("2024-01-01", "2024-01-10")
    assert gaps(spans, within=window) == [span("2024-01-01", "2024-01-04"), span("2024-01-07", "2024-01-10")]


def test_gaps_with_nothing_covered():
    window = span("2024-01-01", "2024-01-10")
    assert gaps([], within=window) == [window]
    assert gaps([]) == []

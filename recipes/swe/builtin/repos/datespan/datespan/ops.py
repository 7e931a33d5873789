"""Operations on collections of spans."""

from .span import ONE_DAY, DateSpan


def merge_spans(spans):
    """Merge overlapping or adjacent spans.

    Returns a new, sorted list in which no two spans overlap or touch::

        Jan 1-10 + Jan 11-20 + Jan 15-31  ->  Jan 1-31
    """
    merged = []
    for span in sorted(spans):
        if merged and span.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = DateSpan(last.start, max(last.end, span.end))
        else:
            merged.append(span)
    return merged


def total_days(spans):
    """Number of distinct days covered by ``spans``."""
    return sum(span.days for span in merge_spans(spans))


def gaps(spans, within=None):
    """Return the spans of days not covered by ``spans``.

    Without ``within`` only the gaps between the first and last covered day
    are reported; with ``within`` the uncovered days of that span are
    reported, including any before the first or after the last span.
    """
    merged = merge_spans(spans)
    if within is not None:
        clipped = []
        for span in merged:
            part = span.intersection(within)
            if part is not None:
                clipped.append(part)
        merged = clipped
        if not merged:
            return [within]
        cursor = within.start
        limit = within.end
    else:
        if not merged:
            return []
        cursor = merged[0].start
        limit = merged[-1].end
    result = []
    for span in merged:
        if span.start > cursor:
            result.append(DateSpan(cursor, span.start - ONE_DAY))
        cursor = max(cursor, span.end + ONE_DAY)
    if cursor <= limit:
        result.append(DateSpan(cursor, limit))
    return result

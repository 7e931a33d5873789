"""The :class:`DateSpan` value type."""

from dataclasses import dataclass
from datetime import date, timedelta

from .calendar_utils import add_months, month_end

ONE_DAY = timedelta(days=1)


@dataclass(frozen=True, order=True)
class DateSpan:
    """A range of calendar days; both ``start`` and ``end`` are inclusive."""

    start: date
    end: date

    def __post_init__(self):
        for name in ("start", "end"):
            value = getattr(self, name)
            if not isinstance(value, date) or hasattr(value, "hour"):
                raise TypeError(f"{name} must be a datetime.date, got {value!r}")
        if self.end < self.start:
            raise ValueError(f"span ends ({self.end}) before it starts ({self.start})")

    @classmethod
    def single(cls, day):
        """A span covering exactly one day."""
        return cls(day, day)

    @property
    def days(self):
        """Number of days in the span (inclusive of both ends)."""
        return (self.end - self.start).days + 1

    def __len__(self):
        return self.days

    def __contains__(self, day):
        return self.start <= day <= self.end

    def __iter__(self):
        day = self.start
        while day <= self.end:
            yield day
            day += ONE_DAY

    def __str__(self):
        return f"{self.start.isoformat()}..{self.end.isoformat()}"

    def overlaps(self, other):
        """True if the two spans have at least one day in common."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other):
        """The days common to both spans, or ``None`` if there are none."""
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        if start > end:
            return None
        return DateSpan(start, end)

    def is_adjacent(self, other):
        """True if one span ends on the day before the other starts."""
        return self.end + ONE_DAY == other.start or other.end + ONE_DAY == self.start

    def shift(self, days):
        """Return the span moved by ``days`` days (may be negative)."""
        delta = timedelta(days=days)
        return DateSpan(self.start + delta, self.end + delta)

    def split_by_month(self):
        """Split the span into consecutive pieces that each stay in one month."""
        pieces = []
        start = self.start
        while start <= self.end:
            end = min(month_end(start), self.end)
            pieces.append(DateSpan(start, end))
            start = add_months(start.replace(day=1), 1)
        return pieces

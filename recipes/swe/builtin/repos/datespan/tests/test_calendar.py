from datetime import date

import pytest

from datespan import add_months, days_in_month, is_leap_year, month_end


@pytest.mark.parametrize(
    "year, expected",
    [(2024, True), (2023, False), (1900, False), (2000, True), (2100, False)],
)
def test_is_leap_year(year, expected):
    assert is_leap_year(year) is expected


def test_days_in_month():
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29
    assert days_in_month(2024, 4) == 30
    assert days_in_month(2024, 12) == 31


def test_days_in_month_rejects_bad_month():
    with pytest.raises(ValueError):
        days_in_month(2024, 13)


def test_month_end():
    assert month_end(date(2024, 2, 10)) == date(2024, 2, 29)
    assert month_end(date(2023, 12, 31)) == date(2023, 12, 31)


@pytest.mark.parametrize(
    "start, months, expected",
    [
        (date(2024, 1, 15), 1, date(2024, 2, 15)),
        (date(2024, 11, 3), 2, date(2025, 1, 3)),
        (date(2024, 3, 10), -3, date(2023, 12, 10)),
        (date(2024, 6, 1), 0, date(2024, 6, 1)),
        (date(2024, 1, 28), 25, date(2026, 2, 28)),
    ],
)
def test_add_months(start, months, expected):
    assert add_months(start, months) == expected

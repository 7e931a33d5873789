import pytest

from textkit import slugify


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Hello World", "hello-world"),
        ("Hello, World!", "hello-world"),
        ("  leading and trailing  ", "leading-and-trailing"),
        ("multiple---dashes___and   spaces", "multiple-dashes-and-spaces"),
        ("Release 2.0.1 notes", "release-2-0-1-notes"),
        ("", ""),
        ("!!!", ""),
    ],
    ids=["spaces", "punctuation", "outer-whitespace", "separator-runs", "digits", "empty", "only-punctuation"],
)
def test_basic_slugs(text, expected):
    assert slugify(text) == expected


def test_custom_separator():
    assert slugify("Hello big World", separator="_") == "hello_big_world"


def test_empty_separator_rejected():
    with pytest.raises(ValueError):
        slugify("x", separator="")


def test_preserve_case():
    assert slugify("Hello World", lowercase=False) == "Hello-World"


def test_non_latin_characters_are_dropped():
    assert slugify("Tokyo 東京 guide") == "tokyo-guide"


def test_max_length_cuts_at_separator():
    assert slugify("the quick brown fox", max_length=12) == "the-quick"


def test_max_length_keeps_word_ending_exactly_at_limit():
    assert slugify("hello world foo", max_length=11) == "hello-world"


def test_max_length_hard_cuts_single_long_word():
    assert slugify("supercalifragilistic", max_length=5) == "super"

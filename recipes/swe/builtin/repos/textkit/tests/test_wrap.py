import pytest

from textkit import fill, wrap


def test_short_text_is_single_line():
    assert wrap("hello world", width=40) == ["hello world"]


def test_wraps_on_word_boundaries():
    text = "The quick brown fox jumps over the lazy dog"
    assert wrap(text, width=13) == ["The quick", "brown fox", "jumps over", "the lazy dog"]


def test_lines_never_exceed_width():
    text = "Lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod"
    for width in (8, 13, 21):
        assert all(len(line) <= width for line in wrap(text, width))


def test_whitespace_is_collapsed():
    assert wrap("one\n\ntwo   three", width=40) == ["one two three"]


def test_empty_text():
    assert wrap("", width=10) == []
    assert wrap("   ", width=10) == []


def test_long_words_are_broken():
    assert wrap("abcdefghij xy", width=4) == ["abcd", "efgh", "ij", "xy"]


def test_long_words_kept_when_not_breaking():
    assert wrap("tiny enormousword end", width=6, break_long_words=False) == [
        "tiny",
        "enormousword",
        "end",
    ]


def test_invalid_width():
    with pytest.raises(ValueError):
        wrap("text", width=0)


def test_fill_joins_lines():
    assert fill("aa bb cc dd", width=6) == "aa bb\ncc dd"

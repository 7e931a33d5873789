import pytest

from textkit import dedent, indent, normalize_whitespace, truncate


def test_dedent_removes_common_margin():
    text = "    def f():\n        return 1"
    assert dedent(text) == "def f():\n    return 1"


def test_dedent_without_common_margin_is_noop():
    text = "  a\nb"
    assert dedent(text) == text


def test_dedent_mixed_tabs_and_spaces_only_removes_true_common_prefix():
    text = "\t  a\n\t b"
    assert dedent(text) == " a\nb"


def test_indent_adds_prefix():
    assert indent("a\nb", "> ") == "> a\n> b"


def test_indent_skips_blank_lines_by_default():
    assert indent("a\n\nb", "  ") == "  a\n\n  b"
    assert indent("a\n\nb", "  ", skip_blank=False) == "  a\n  \n  b"


def test_truncate_short_text_unchanged():
    assert truncate("short", 10) == "short"
    assert truncate("exactly10!", 10) == "exactly10!"


def test_truncate_prefers_word_boundary():
    assert truncate("The quick brown fox", 12) == "The quick…"


def test_truncate_result_never_exceeds_width():
    text = "Pack my box with five dozen liquor jugs"
    for width in range(0, len(text) + 1):
        assert len(truncate(text, width)) <= width


def test_truncate_custom_placeholder():
    assert truncate("Sphinx of black quartz", 15, placeholder="...") == "Sphinx of..."


def test_truncate_hard_cut_without_spaces():
    assert truncate("abcdefghijkl", 6) == "abcde…"


def test_truncate_tiny_width():
    assert truncate("hello", 2, placeholder="...") == ".."


def test_truncate_negative_width():
    with pytest.raises(ValueError):
        truncate("text", -1)


def test_normalize_whitespace():
    assert normalize_whitespace("  a \t b\n\nc  ") == "a b c"

import pytest

from minicalc import TokenizeError, tokenize
from minicalc.tokenizer import EOF, NAME, NUMBER, OP


def kinds(source):
    return [token.kind for token in tokenize(source)]


def values(source):
    return [token.value for token in tokenize(source)[:-1]]


def test_integer_literal():
    tokens = tokenize("42")
    assert tokens[0].kind == NUMBER
    assert tokens[0].value == 42
    assert isinstance(tokens[0].value, int)


def test_decimal_literals():
    assert values("3.25 .5 7.") == [3.25, 0.5, 7.0]


def test_scientific_literal():
    assert values("1.5e3") == [1500.0]
    assert values("2E4") == [20000.0]


def test_malformed_exponent_is_rejected():
    with pytest.raises(TokenizeError):
        tokenize("1e")


def test_operators_and_names():
    assert values("width*2 + offset") == ["width", "*", 2, "+", "offset"]
    assert kinds("a % b") == [NAME, OP, NAME, EOF]


def test_whitespace_is_ignored():
    assert values("  1\t+\n2 ") == [1, "+", 2]


def test_token_positions():
    tokens = tokenize("12 + ab")
    assert [token.pos for token in tokens] == [0, 3, 5, 7]


def test_eof_token_is_always_last():
    tokens = tokenize("")
    assert len(tokens) == 1
    assert tokens[0].kind == EOF


def test_unexpected_character_reports_position():
    with pytest.raises(TokenizeError) as excinfo:
        tokenize("1 + $")
    assert excinfo.value.position == 4
    assert "'$'" in str(excinfo.value)

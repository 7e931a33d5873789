import pytest

from minicalc import ParseError, format_ast, parse
from minicalc.parser import Assign, BinOp, Call, Num, Var


def grouped(source):
    return format_ast(parse(source))


def test_single_number():
    assert parse("7") == Num(7)


def test_multiplication_binds_tighter_than_addition():
    assert grouped("1 + 2 * 3") == "(1 + (2 * 3))"
    assert grouped("1 * 2 + 3") == "((1 * 2) + 3)"


def test_left_associativity_of_subtraction_and_division():
    assert grouped("10 - 4 - 3") == "((10 - 4) - 3)"
    assert grouped("8 / 4 / 2") == "((8 / 4) / 2)"


def test_power_binds_tighter_than_multiplication():
    assert grouped("2 * 3 ^ 2") == "(2 * (3 ^ 2))"


def test_parentheses_override_precedence():
    assert grouped("(1 + 2) * 3") == "((1 + 2) * 3)"


def test_unary_minus():
    assert grouped("-3 * 2") == "((-3) * 2)"
    assert grouped("4 - -1") == "(4 - (-1))"


def test_function_call_arguments():
    node = parse("max(1, x + 1, 3)")
    assert isinstance(node, Call)
    assert node.name == "max"
    assert node.args == (Num(1), BinOp("+", Var("x"), Num(1)), Num(3))


def test_function_call_without_arguments():
    assert parse("f()") == Call("f", ())


def test_assignment():
    assert parse("x = 1 + 2") == Assign("x", BinOp("+", Num(1), Num(2)))


@pytest.mark.parametrize(
    "source",
    ["", "1 +", "(1 + 2", "1 2", "max(1,", "= 3"],
    ids=["empty", "dangling-operator", "unclosed-paren", "missing-operator", "unclosed-call", "bare-assign"],
)
def test_invalid_expressions(source):
    with pytest.raises(ParseError):
        parse(source)

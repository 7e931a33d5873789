import math

import pytest

from minicalc import CalcError, EvaluationError, Evaluator, evaluate


def test_arithmetic():
    assert evaluate("1 + 2 * 3") == 7
    assert evaluate("(1 + 2) * 3") == 9
    assert evaluate("7 / 2") == 3.5
    assert evaluate("7 % 4") == 3


def test_power():
    assert evaluate("2 ^ 10") == 1024
    assert evaluate("9 ^ 0.5") == 3.0


def test_unary_operators():
    assert evaluate("-3 + 5") == 2
    assert evaluate("+4") == 4


def test_keyword_variables():
    assert evaluate("x * y", x=3, y=4) == 12


def test_constants():
    assert evaluate("pi") == math.pi
    assert evaluate("2 * e") == 2 * math.e


def test_functions():
    assert evaluate("max(1, 5, 3)") == 5
    assert evaluate("abs(-2.5)") == 2.5
    assert evaluate("sqrt(16)") == 4.0
    assert evaluate("floor(2.7) + ceil(2.2)") == 5


def test_custom_functions():
    calc = Evaluator({}, functions={"double": lambda value: value * 2})
    assert calc.evaluate("double(21)") == 42


def test_assignment_persists_in_evaluator():
    calc = Evaluator({"base": 10})
    assert calc.evaluate("total = base * 3") == 30
    assert calc.evaluate("total + 1") == 31
    assert calc.variables["total"] == 30


def test_set_variable():
    calc = Evaluator({})
    calc.set("rate", 0.5)
    assert calc.evaluate("rate * 4") == 2.0


def test_constants_cannot_be_reassigned():
    with pytest.raises(EvaluationError):
        Evaluator({}).evaluate("pi = 3")


def test_undefined_variable():
    with pytest.raises(EvaluationError, match="undefined variable 'nope'"):
        evaluate("nope + 1")


def test_unknown_function():
    with pytest.raises(EvaluationError, match="unknown function"):
        evaluate("frobnicate(1)")


def test_function_errors_are_wrapped():
    with pytest.raises(EvaluationError):
        evaluate("sqrt(-1)")
    with pytest.raises(EvaluationError):
        evaluate("max()")


def test_all_errors_share_a_base_class():
    for source in ["1 +", "1 $ 2", "missing"]:
        with pytest.raises(CalcError):
            evaluate(source)

TASKS = []

TASKS.append(
    dict(
        repo="minicalc",
        problem_statement="""Exponentiation chains are evaluated left to right

The README says `^` is right-associative (`2 ^ 3 ^ 2 == 2 ^ 9`), but chained powers are grouped from the left:

```python
>>> from minicalc import evaluate, format_ast, parse
>>> evaluate("2 ^ 3 ^ 2")
64
>>> format_ast(parse("2 ^ 3 ^ 2"))
'((2 ^ 3) ^ 2)'
```

Expected `512` and `'(2 ^ (3 ^ 2))'`, following the usual mathematical convention (and Python's `**`). Longer chains such as `a ^ b ^ c ^ d` should group as `a ^ (b ^ (c ^ d))`. The other binary operators (`-`, `/`, ...) must remain left-associative.
""",
        gold=[
            (
                "replace",
                "minicalc/parser.py",
                """    "^": 30,
}
""",
                """    "^": 30,
}

# Operators that group right-to-left: 2 ^ 3 ^ 2 == 2 ^ (3 ^ 2).
RIGHT_ASSOCIATIVE = frozenset({"^"})
""",
            ),
            (
                "replace",
                "minicalc/parser.py",
                """            self.advance()
            right = self.parse_expression(precedence + 1)
""",
                """            self.advance()
            if token.value in RIGHT_ASSOCIATIVE:
                next_min = precedence
            else:
                next_min = precedence + 1
            right = self.parse_expression(next_min)
""",
            ),
        ],
        tests=[
            (
                "append",
                "tests/test_parser.py",
                """

def test_power_is_right_associative():
    assert grouped("2 ^ 3 ^ 2") == "(2 ^ (3 ^ 2))"
    assert grouped("a ^ b ^ c ^ d") == "(a ^ (b ^ (c ^ d)))"


def test_mixed_chain_keeps_left_associativity_elsewhere():
    assert grouped("1 - 2 ^ 3 ^ 2 - 4") == "((1 - (2 ^ (3 ^ 2))) - 4)"
""",
            ),
            (
                "append",
                "tests/test_evaluator.py",
                """

def test_chained_powers():
    assert evaluate("2 ^ 3 ^ 2") == 512
    assert evaluate("2 ^ 2 ^ 3 / 2") == 128.0
""",
            ),
        ],
        expect_f2p=[
            "tests/test_parser.py::test_power_is_right_associative",
            "tests/test_parser.py::test_mixed_chain_keeps_left_associativity_elsewhere",
            "tests/test_evaluator.py::test_chained_powers",
        ],
    )
)

TASKS.append(
    dict(
        repo="minicalc",
        problem_statement="""Unary minus binds tighter than `^`: `-2 ^ 2` evaluates to 4

According to the README, exponentiation binds tighter than unary minus, as in ordinary maths notation, so `-2 ^ 2 == -4`. minicalc applies the negation first:

```python
>>> from minicalc import evaluate, format_ast, parse
>>> evaluate("-2 ^ 2")
4
>>> evaluate("-x ^ 2", x=3)
9
>>> format_ast(parse("-2 ^ 2"))
'((-2) ^ 2)'
```

Expected `-4`, `-9` and `'(-(2 ^ 2))'`. Negation should still bind tighter than `*` and `/` (`-3 * 2` is `(-3) * 2`), an explicitly parenthesised base `(-2) ^ 2` must still give 4, and negative exponents such as `2 ^ -1` must keep working.
""",
        gold=[
            (
                "replace",
                "minicalc/parser.py",
                """    "^": 30,
}
""",
                """    "^": 30,
}

# Unary + and - bind tighter than * and / but looser than ^, so that
# -2 ^ 2 == -(2 ^ 2) as in ordinary mathematical notation.
UNARY_PRECEDENCE = 25
""",
            ),
            (
                "replace",
                "minicalc/parser.py",
                """            return UnaryOp(token.value, self.parse_unary())
""",
                """            return UnaryOp(token.value, self.parse_expression(UNARY_PRECEDENCE))
""",
            ),
        ],
        tests=[
            (
                "append",
                "tests/test_parser.py",
                """

def test_power_binds_tighter_than_unary_minus():
    assert grouped("-2 ^ 2") == "(-(2 ^ 2))"
    assert grouped("-x ^ 2 * 3") == "((-(x ^ 2)) * 3)"


def test_negative_exponent():
    assert grouped("2 ^ -1") == "(2 ^ (-1))"
""",
            ),
            (
                "append",
                "tests/test_evaluator.py",
                """

def test_negated_powers():
    assert evaluate("-2 ^ 2") == -4
    assert evaluate("-x ^ 2", x=3) == -9
    assert evaluate("(-2) ^ 2") == 4
    assert evaluate("2 ^ -1") == 0.5
""",
            ),
        ],
        expect_f2p=[
            "tests/test_parser.py::test_power_binds_tighter_than_unary_minus",
            "tests/test_evaluator.py::test_negated_powers",
        ],
    )
)

TASKS.append(
    dict(
        repo="minicalc",
        problem_statement="""Scientific notation with a signed exponent is rejected

The README lists `2E-4` as a supported literal, but any exponent with an explicit sign fails to tokenize:

```python
>>> from minicalc import evaluate
>>> evaluate("1e-3 * 2")
Traceback (most recent call last):
  ...
minicalc.errors.TokenizeError: malformed exponent in number literal at position 0
>>> evaluate("6.02E+23")
Traceback (most recent call last):
  ...
minicalc.errors.TokenizeError: malformed exponent in number literal at position 0
```

Expected `0.002` and `6.02e+23`; `tokenize("2.5e-2*4")` should produce the tokens `0.025`, `*`, `4`. An exponent marker or sign without digits (`1e`, `1e+`) should still be rejected with a `TokenizeError`.
""",
        gold=[
            (
                "replace",
                "minicalc/tokenizer.py",
                """    if i < n and source[i] in "eE":
        i += 1
        if i >= n""",
                """    if i < n and source[i] in "eE":
        i += 1
        if i < n and source[i] in "+-":
            i += 1
        if i >= n""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_tokenizer.py",
                """

def test_scientific_literal_with_signed_exponent():
    assert values("1e-3") == [0.001]
    assert values("6.02E+23") == [6.02e23]
    assert values("2.5e-2*4") == [0.025, "*", 4]


def test_exponent_sign_without_digits_is_rejected():
    with pytest.raises(TokenizeError):
        tokenize("1e+")
    with pytest.raises(TokenizeError):
        tokenize("2E- 3")
""",
            ),
            (
                "append",
                "tests/test_evaluator.py",
                """

def test_scientific_notation():
    assert evaluate("1e-3 * 2") == 0.002
    assert evaluate("1.5E+2 - 50") == 100.0
""",
            ),
        ],
        expect_f2p=[
            "tests/test_tokenizer.py::test_scientific_literal_with_signed_exponent",
            "tests/test_evaluator.py::test_scientific_notation",
        ],
    )
)

TASKS.append(
    dict(
        repo="minicalc",
        problem_statement="""Floor division `//` raises ParseError

`//` is listed as a supported operator, but any expression using it fails to parse:

```python
>>> from minicalc import evaluate, tokenize
>>> evaluate("7 // 2")
Traceback (most recent call last):
  ...
minicalc.errors.ParseError: unexpected '/' at position 3
>>> tokenize("7 // 2")
[Token(NUMBER, 7, 0), Token(OP, '/', 2), Token(OP, '/', 3), Token(NUMBER, 2, 5), Token(EOF, None, 6)]
```

Expected: `//` is a single operator token (at position 2 in the example) and `evaluate("7 // 2") == 3`. Like Python, it should floor: `-7 // 2 == -4` and `7.5 // 2 == 3.0`. A single `/` must keep meaning true division.
""",
        gold=[
            (
                "replace",
                "minicalc/tokenizer.py",
                """# Operator spellings recognised by the tokenizer.
OPERATORS = ("+", "-", "*", "/", "%", "^", "=", "//")
""",
                """# Operator spellings recognised by the tokenizer. Multi-character operators
# must come first so that the longest match wins ("//" before "/").
OPERATORS = ("//", "+", "-", "*", "/", "%", "^", "=")
""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_tokenizer.py",
                """

def test_floor_division_is_a_single_token():
    tokens = tokenize("7 // 2")
    assert [(t.kind, t.value) for t in tokens] == [(NUMBER, 7), (OP, "//"), (NUMBER, 2), (EOF, None)]
    assert tokens[1].pos == 2


def test_true_division_still_single_slash():
    assert values("8/2") == [8, "/", 2]
""",
            ),
            (
                "append",
                "tests/test_evaluator.py",
                """

def test_floor_division():
    assert evaluate("7 // 2") == 3
    assert evaluate("-7 // 2") == -4
    assert evaluate("7.5 // 2") == 3.0
    assert evaluate("9 // 2 * 2") == 8
""",
            ),
        ],
        expect_f2p=[
            "tests/test_tokenizer.py::test_floor_division_is_a_single_token",
            "tests/test_evaluator.py::test_floor_division",
        ],
    )
)

TASKS.append(
    dict(
        repo="minicalc",
        problem_statement="""Variables leak between `Evaluator` instances

We create one `Evaluator()` per user session in a web service, and users started seeing each other's variables:

```python
>>> from minicalc import Evaluator
>>> alice = Evaluator()
>>> alice.evaluate("secret = 42")
42
>>> bob = Evaluator()
>>> bob.evaluate("secret")
42
>>> bob.variables
{'secret': 42}
```

Expected: an `Evaluator` created without a `variables` argument starts with no user variables, so `bob.evaluate("secret")` raises `EvaluationError: undefined variable 'secret'`, and variables bound via assignment or `Evaluator.set()` on one instance are never visible from another default-constructed instance. Passing an explicit dict (`Evaluator({"base": 10})`) should behave as before.
""",
        gold=[
            (
                "replace",
                "minicalc/evaluator.py",
                """    def __init__(self, variables={}, functions=None):
        self.variables = variables
""",
                """    def __init__(self, variables=None, functions=None):
        self.variables = {} if variables is None else variables
""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_evaluator.py",
                """

def test_fresh_evaluators_do_not_share_variables():
    first = Evaluator()
    first.evaluate("secret = 42")
    second = Evaluator()
    with pytest.raises(EvaluationError, match="undefined variable 'secret'"):
        second.evaluate("secret")
    assert "secret" not in second.variables


def test_set_does_not_leak_into_new_evaluators():
    Evaluator().set("leaky", 1)
    assert Evaluator().variables == {}
""",
            )
        ],
        expect_f2p=[
            "tests/test_evaluator.py::test_fresh_evaluators_do_not_share_variables",
            "tests/test_evaluator.py::test_set_does_not_leak_into_new_evaluators",
        ],
    )
)

TASKS.append(
    dict(
        repo="minicalc",
        problem_statement="""Division by zero escapes as `ZeroDivisionError` instead of a `CalcError`

The README promises that every error raised by minicalc derives from `minicalc.CalcError`, so we only catch that around user input. Dividing by zero bypasses it:

```python
>>> from minicalc import CalcError, evaluate
>>> try:
...     evaluate("1 / (x - 2)", x=2)
... except CalcError as exc:
...     print("bad input:", exc)
...
Traceback (most recent call last):
  ...
ZeroDivisionError: division by zero
```

The same happens for `5 % 0`, and a float overflow such as `10.0 ^ 400` leaks `OverflowError`.

Expected: these raise `minicalc.EvaluationError`; for division or modulo by zero the message should say `division by zero`.
""",
        gold=[
            (
                "replace",
                "minicalc/evaluator.py",
                """            right = self.eval_node(node.right)
            return BINARY_OPERATORS[node.op](left, right)
""",
                """            right = self.eval_node(node.right)
            try:
                return BINARY_OPERATORS[node.op](left, right)
            except ZeroDivisionError:
                raise EvaluationError("division by zero") from None
            except OverflowError as exc:
                raise EvaluationError(f"numeric overflow: {exc}") from None
""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_evaluator.py",
                """

def test_division_by_zero_raises_evaluation_error():
    with pytest.raises(EvaluationError, match="division by zero"):
        evaluate("1 / (x - 2)", x=2)
    with pytest.raises(EvaluationError, match="division by zero"):
        evaluate("5 % 0")


def test_float_overflow_raises_evaluation_error():
    with pytest.raises(EvaluationError):
        evaluate("10.0 ^ 400")
""",
            )
        ],
        expect_f2p=[
            "tests/test_evaluator.py::test_division_by_zero_raises_evaluation_error",
            "tests/test_evaluator.py::test_float_overflow_raises_evaluation_error",
        ],
    )
)

"""Evaluate minicalc ASTs."""

import math
import operator

from .errors import EvaluationError
from .parser import Assign, BinOp, Call, Num, UnaryOp, Var, parse

DEFAULT_FUNCTIONS = {
    "abs": abs,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
}

CONSTANTS = {
    "pi": math.pi,
    "e": math.e,
}

BINARY_OPERATORS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "^": operator.pow,
}

UNARY_OPERATORS = {
    "+": operator.pos,
    "-": operator.neg,
}


class Evaluator:
    """Evaluate expressions against a set of variables and functions.

    An evaluator keeps the variables assigned through ``name = expr``
    statements (or :meth:`set`) so that later expressions can use them::

        calc = Evaluator()
        calc.evaluate("width = 3")
        calc.evaluate("width * 2")   # -> 6
    """

    def __init__(self, variables={}, functions=None):
        self.variables = variables
        self.functions = dict(DEFAULT_FUNCTIONS)
        if functions:
            self.functions.update(functions)

    def set(self, name, value):
        """Bind ``name`` to ``value`` for subsequent evaluations."""
        if name in CONSTANTS:
            raise EvaluationError(f"cannot assign to constant {name!r}")
        self.variables[name] = value

    def evaluate(self, source):
        """Parse and evaluate ``source``, returning the resulting number."""
        return self.eval_node(parse(source))

    def eval_node(self, node):
        if isinstance(node, Num):
            return node.value
        if isinstance(node, Var):
            return self._lookup(node.name)
        if isinstance(node, UnaryOp):
            return UNARY_OPERATORS[node.op](self.eval_node(node.operand))
        if isinstance(node, BinOp):
            left = self.eval_node(node.left)
            right = self.eval_node(node.right)
            return BINARY_OPERATORS[node.op](left, right)
        if isinstance(node, Call):
            return self._call(node)
        if isinstance(node, Assign):
            value = self.eval_node(node.value)
            self.set(node.name, value)
            return value
        raise EvaluationError(f"cannot evaluate node {node!r}")

    def _lookup(self, name):
        if name in self.variables:
            return self.variables[name]
        if name in CONSTANTS:
            return CONSTANTS[name]
        raise EvaluationError(f"undefined variable {name!r}")

    def _call(self, node):
        try:
            func = self.functions[node.name]
        except KeyError:
            raise EvaluationError(f"unknown function {node.name!r}") from None
        args = [self.eval_node(arg) for arg in node.args]
        try:
            return func(*args)
        except (TypeError, ValueError) as exc:
            raise EvaluationError(f"{node.name}(): {exc}") from exc


def evaluate(source, **variables):
    """Evaluate ``source`` once, with ``variables`` as keyword arguments."""
    return Evaluator(variables).evaluate(source)

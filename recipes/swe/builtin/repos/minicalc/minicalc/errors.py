"""Exception hierarchy for minicalc.

Every error raised while tokenizing, parsing or evaluating an expression is a
subclass of :class:`CalcError`, so callers only need a single ``except``.
"""


class CalcError(Exception):
    """Base class for all minicalc errors."""


class TokenizeError(CalcError):
    """Raised when the input contains characters that cannot be tokenized."""

    def __init__(self, message, position):
        super().__init__(f"{message} at position {position}")
        self.position = position


class ParseError(CalcError):
    """Raised when the token stream does not form a valid expression."""


class EvaluationError(CalcError):
    """Raised when a syntactically valid expression cannot be evaluated."""

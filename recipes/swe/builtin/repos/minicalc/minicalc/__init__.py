"""minicalc - a tiny, safe arithmetic expression evaluator."""

from .errors import CalcError, EvaluationError, ParseError, TokenizeError
from .evaluator import Evaluator, evaluate
from .parser import format_ast, parse
from .tokenizer import Token, tokenize

__all__ = [
    "CalcError",
    "EvaluationError",
    "Evaluator",
    "ParseError",
    "Token",
    "TokenizeError",
    "evaluate",
    "format_ast",
    "parse",
    "tokenize",
]

__version__ = "0.3.1"

"""Precedence-climbing parser producing a small immutable AST."""

from dataclasses import dataclass
from typing import Tuple

from .errors import ParseError
from .tokenizer import COMMA, EOF, LPAREN, NAME, NUMBER, OP, RPAREN, tokenize


@dataclass(frozen=True)
class Num:
    value: object


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class UnaryOp:
    op: str
    operand: object


@dataclass(frozen=True)
class BinOp:
    op: str
    left: object
    right: object


@dataclass(frozen=True)
class Call:
    name: str
    args: Tuple[object, ...]


@dataclass(frozen=True)
class Assign:
    name: str
    value: object


# Binding power of the binary operators; higher binds tighter.
BINARY_PRECEDENCE = {
    "+": 10,
    "-": 10,
    "*": 20,
    "/": 20,
    "//": 20,
    "%": 20,
    "^": 30,
}


def _describe(token):
    if token.kind == EOF:
        return "end of expression"
    return f"{token.value!r} at position {token.pos}"


class Parser:
    """Parse a token list produced by :func:`minicalc.tokenizer.tokenize`."""

    def __init__(self, tokens):
        self.tokens = list(tokens)
        self.index = 0

    # -- token helpers -------------------------------------------------
    def peek(self, offset=0):
        index = min(self.index + offset, len(self.tokens) - 1)
        return self.tokens[index]

    def advance(self):
        token = self.peek()
        if token.kind != EOF:
            self.index += 1
        return token

    def expect(self, kind):
        token = self.peek()
        if token.kind != kind:
            raise ParseError(f"expected {kind.lower()}, found {_describe(token)}")
        return self.advance()

    # -- grammar -------------------------------------------------------
    def parse(self):
        """Parse a complete statement (an assignment or an expression)."""
        if self.peek().kind == EOF:
            raise ParseError("empty expression")
        if (
            self.peek().kind == NAME
            and self.peek(1).kind == OP
            and self.peek(1).value == "="
        ):
            name = self.advance().value
            self.advance()
            node = Assign(name, self.parse_expression(0))
        else:
            node = self.parse_expression(0)
        token = self.peek()
        if token.kind != EOF:
            raise ParseError(f"unexpected {_describe(token)}")
        return node

    def parse_expression(self, min_precedence):
        left = self.parse_unary()
        while True:
            token = self.peek()
            if token.kind != OP or token.value not in BINARY_PRECEDENCE:
                break
            precedence = BINARY_PRECEDENCE[token.value]
            if precedence < min_precedence:
                break
            self.advance()
            right = self.parse_expression(precedence + 1)
            left = BinOp(token.value, left, right)
        return left

    def parse_unary(self):
        token = self.peek()
        if token.kind == OP and token.value in ("+", "-"):
            self.advance()
            return UnaryOp(token.value, self.parse_unary())
        return self.parse_primary()

    def parse_primary(self):
        token = self.peek()
        if token.kind == NUMBER:
            self.advance()
            return Num(token.value)
        if token.kind == NAME:
            self.advance()
            if self.peek().kind == LPAREN:
                return Call(token.value, self.parse_arguments())
            return Var(token.value)
        if token.kind == LPAREN:
            self.advance()
            node = self.parse_expression(0)
            self.expect(RPAREN)
            return node
        raise ParseError(f"unexpected {_describe(token)}")

    def parse_arguments(self):
        self.expect(LPAREN)
        args = []
        if self.peek().kind != RPAREN:
            args.append(self.parse_expression(0))
            while self.peek().kind == COMMA:
                self.advance()
                args.append(self.parse_expression(0))
        self.expect(RPAREN)
        return tuple(args)


def parse(source):
    """Parse ``source`` (a string) into an AST node."""
    return Parser(tokenize(source)).parse()


def format_ast(node):
    """Render ``node`` as a fully parenthesised string.

    Useful for debugging and for checking how an expression was grouped::

        >>> format_ast(parse("1 + 2 * 3"))
        '(1 + (2 * 3))'
    """
    if isinstance(node, Num):
        return repr(node.value)
    if isinstance(node, Var):
        return node.name
    if isinstance(node, UnaryOp):
        return f"({node.op}{format_ast(node.operand)})"
    if isinstance(node, BinOp):
        return f"({format_ast(node.left)} {node.op} {format_ast(node.right)})"
    if isinstance(node, Call):
        args = ", ".join(format_ast(arg) for arg in node.args)
        return f"{node.name}({args})"
    if isinstance(node, Assign):
        return f"{node.name} = {format_ast(node.value)}"
    raise TypeError(f"not an AST node: {node!r}")

"""Turn expression source text into a list of tokens."""

from dataclasses import dataclass

from .errors import TokenizeError

NUMBER = "NUMBER"
NAME = "NAME"
OP = "OP"
LPAREN = "LPAREN"
RPAREN = "RPAREN"
COMMA = "COMMA"
EOF = "EOF"

# Operator spellings recognised by the tokenizer.
OPERATORS = ("+", "-", "*", "/", "%", "^", "=", "//")

_DIGITS = "0123456789"


@dataclass(frozen=True)
class Token:
    """A single lexical token.

    ``pos`` is the zero-based offset of the token's first character in the
    source string.
    """

    kind: str
    value: object
    pos: int

    def __repr__(self):
        return f"Token({self.kind}, {self.value!r}, {self.pos})"


def _read_number(source, start):
    """Read a numeric literal starting at ``start``.

    Returns ``(token, next_index)``. Literals containing a decimal point or an
    exponent produce floats, everything else produces ints.
    """
    i = start
    n = len(source)
    while i < n and source[i] in _DIGITS:
        i += 1
    if i < n and source[i] == ".":
        i += 1
        while i < n and source[i] in _DIGITS:
            i += 1
    if i < n and source[i] in "eE":
        i += 1
        if i >= n or source[i] not in _DIGITS:
            raise TokenizeError("malformed exponent in number literal", start)
        while i < n and source[i] in _DIGITS:
            i += 1
    text = source[start:i]
    if any(c in text for c in ".eE"):
        value = float(text)
    else:
        value = int(text)
    return Token(NUMBER, value, start), i


def _read_name(source, start):
    i = start
    n = len(source)
    while i < n and (source[i].isalnum() or source[i] == "_"):
        i += 1
    return Token(NAME, source[start:i], start), i


def tokenize(source):
    """Split ``source`` into a list of :class:`Token` objects.

    The returned list always ends with an ``EOF`` token whose position is the
    length of the source.
    """
    tokens = []
    i = 0
    n = len(source)
    while i < n:
        ch = source[i]
        if ch.isspace():
            i += 1
            continue
        if ch in _DIGITS or (ch == "." and i + 1 < n and source[i + 1] in _DIGITS):
            token, i = _read_number(source, i)
            tokens.append(token)
            continue
        if ch.isalpha() or ch == "_":
            token, i = _read_name(source, i)
            tokens.append(token)
            continue
        if ch == "(":
            tokens.append(Token(LPAREN, ch, i))
            i += 1
            continue
        if ch == ")":
            tokens.append(Token(RPAREN, ch, i))
            i += 1
            continue
        if ch == ",":
            tokens.append(Token(COMMA, ch, i))
            i += 1
            continue
        for op in OPERATORS:
            if source.startswith(op, i):
                tokens.append(Token(OP, op, i))
                i += len(op)
                break
        else:
            raise TokenizeError(f"unexpected character {ch!r}", i)
    tokens.append(Token(EOF, None, n))
    return tokens

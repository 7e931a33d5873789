"""Case conversion helpers."""

import re

# Words that stay lower case in headlines (unless first or last).
SMALL_WORDS = frozenset(
    "a an and as at but by en for if in nor of on or per the to up via vs".split()
)

_LOWER_TO_UPPER = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _capitalize(word):
    """Capitalise ``word`` unless it already has deliberate inner capitals."""
    if any(ch.isupper() for ch in word[1:]):
        # iPhone, McDonald, NASA: leave the author's casing alone
        return word
    return word[:1].upper() + word[1:].lower()


def _capitalize_hyphenated(word):
    return "-".join(_capitalize(part) for part in word.split("-"))


def title_case(text):
    """Convert ``text`` to headline style title case.

    Every word is capitalised except the :data:`SMALL_WORDS`, which stay lower
    case unless they are the first or the last word of the title::

        >>> title_case("the lord of the rings")
        'The Lord of the Rings'
    """
    words = text.split()
    result = []
    for index, word in enumerate(words):
        lower = word.lower()
        if index > 0 and lower in SMALL_WORDS:
            result.append(lower)
        else:
            result.append(_capitalize_hyphenated(word))
    return " ".join(result)


def camel_to_snake(name):
    """Convert ``camelCase`` / ``PascalCase`` identifiers to ``snake_case``.

    Runs of capitals are treated as acronyms::

        >>> camel_to_snake("parseHTTPResponse")
        'parse_http_response'
    """
    return _LOWER_TO_UPPER.sub("_", name).lower()


def snake_to_camel(name, upper_first=False):
    """Convert ``snake_case`` to ``camelCase`` (or ``PascalCase``).

    Leading underscores are preserved so that private names stay private.
    """
    stripped = name.lstrip("_")
    prefix = name[: len(name) - len(stripped)]
    parts = [part for part in stripped.split("_") if part]
    if not parts:
        return name
    head, *tail = parts
    head = head.capitalize() if upper_first else head.lower()
    return prefix + head + "".join(part.capitalize() for part in tail)

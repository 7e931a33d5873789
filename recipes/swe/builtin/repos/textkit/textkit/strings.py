"""Indentation, truncation and whitespace helpers."""


def _leading_whitespace(line):
    return line[: len(line) - len(line.lstrip(" \t"))]


def dedent(text):
    """Remove any common leading whitespace from every line of ``text``.

    Lines consisting solely of whitespace are ignored when computing the
    common margin (and are normalised to empty lines in the output), so
    text pasted from an indented block dedents as expected.
    """
    lines = text.split("\n")
    margin = None
    for line in lines:
        prefix = _leading_whitespace(line)
        if margin is None:
            margin = prefix
            continue
        # shrink the margin to the common prefix of both
        common = 0
        for a, b in zip(margin, prefix):
            if a != b:
                break
            common += 1
        margin = margin[:common]
    if not margin:
        return text
    return "\n".join(line[len(margin) :] for line in lines)


def indent(text, prefix, skip_blank=True):
    """Add ``prefix`` to the start of every line of ``text``.

    Blank lines are left untouched unless ``skip_blank`` is false.
    """
    lines = text.split("\n")
    out = []
    for line in lines:
        if skip_blank and not line.strip():
            out.append(line)
        else:
            out.append(prefix + line)
    return "\n".join(out)


def truncate(text, width, placeholder="…"):
    """Shorten ``text`` to at most ``width`` characters.

    If the text is too long it is cut at a word boundary where possible and
    ``placeholder`` is appended; the result (placeholder included) is never
    longer than ``width``::

        >>> truncate("The quick brown fox", 12)
        'The quick…'
    """
    if width < 0:
        raise ValueError("width must not be negative")
    if len(text) <= width:
        return text
    if width <= len(placeholder):
        return placeholder[:width]
    limit = width - len(placeholder)
    cut = text[:limit]
    space = cut.rfind(" ")
    if space > 0:
        cut = cut[:space]
    return cut.rstrip() + placeholder


def normalize_whitespace(text):
    """Collapse every run of whitespace to a single space and strip the ends."""
    return " ".join(text.split())

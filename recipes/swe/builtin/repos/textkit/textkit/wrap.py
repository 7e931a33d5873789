"""Greedy word wrapping."""


def _chunks(word, width):
    return [word[i : i + width] for i in range(0, len(word), width)]


def wrap(text, width=70, break_long_words=True):
    """Wrap ``text`` into a list of lines no longer than ``width``.

    Whitespace (including newlines) between words is collapsed. Words longer
    than ``width`` are split across lines when ``break_long_words`` is true,
    otherwise they are placed on a line of their own.
    """
    if width < 1:
        raise ValueError("width must be at least 1")
    lines = []
    current = []
    current_len = 0
    for word in text.split():
        if break_long_words and len(word) > width:
            if current:
                lines.append(" ".join(current))
            *full, word = _chunks(word, width)
            lines.extend(full)
            current = [word]
            current_len = len(word)
            continue
        if not current:
            current = [word]
            current_len = len(word)
        elif current_len + 1 + len(word) < width:
            current.append(word)
            current_len += 1 + len(word)
        else:
            lines.append(" ".join(current))
            current = [word]
            current_len = len(word)
    if current:
        lines.append(" ".join(current))
    return lines


def fill(text, width=70, break_long_words=True):
    """Like :func:`wrap` but return a single string joined with newlines."""
    return "\n".join(wrap(text, width, break_long_words))

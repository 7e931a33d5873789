"""URL slug generation."""

import re
import unicodedata

_UNSAFE = re.compile(r"[^A-Za-z0-9]+")


def slugify(text, separator="-", max_length=None, lowercase=True):
    """Return an ASCII, URL-safe slug for ``text``.

    Accented Latin letters are transliterated to their base letter, every run
    of other characters becomes a single ``separator`` and leading/trailing
    separators are removed::

        >>> slugify("Hello, World!")
        'hello-world'

    If ``max_length`` is given the slug is cut at the last separator that keeps
    it within the limit (or hard-truncated if a single word is too long).
    """
    if not separator:
        raise ValueError("separator must be a non-empty string")
    text = unicodedata.normalize("NFC", text)
    text = text.encode("ascii", "ignore").decode("ascii")
    if lowercase:
        text = text.lower()
    slug = _UNSAFE.sub(separator, text).strip(separator)
    if max_length is not None and len(slug) > max_length:
        cut = slug.rfind(separator, 0, max_length + 1)
        slug = slug[:cut] if cut > 0 else slug[:max_length]
        slug = slug.rstrip(separator)
    return slug

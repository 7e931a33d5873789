"""textkit - small, dependency-free text utilities."""

from .case import camel_to_snake, snake_to_camel, title_case
from .slug import slugify
from .strings import dedent, indent, normalize_whitespace, truncate
from .wrap import fill, wrap

__all__ = [
    "camel_to_snake",
    "dedent",
    "fill",
    "indent",
    "normalize_whitespace",
    "slugify",
    "snake_to_camel",
    "title_case",
    "truncate",
    "wrap",
]

__version__ = "1.4.0"

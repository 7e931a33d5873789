"""Sandbox images for the container adapters, built on this machine without a registry
(``build``: specs as data, ``orchard-async images build``; ``wheels``: Python wheels baked in).

Recipes declare their images as ``IMAGES: list[ImageSpec]``; adapters name the build command
in their "image missing" errors.
"""

from orchard_async.images.build import (
    ImageMissing,
    ImageSpec,
    build_command,
    build_images,
    known_images,
    missing_image_hint,
    recipe_images,
)

__all__ = [
    "ImageMissing",
    "ImageSpec",
    "build_command",
    "build_images",
    "known_images",
    "missing_image_hint",
    "recipe_images",
]

"""Pillow, opened safely: only the plugins of the formats a batch decodes, and never an image
over its pixel cap (read from the header, before any pixel is decoded).

Imports: the standard library and Pillow (when installed); nothing of asyncloader.
"""

from __future__ import annotations

import io
from typing import Any


def pillow() -> Any:
    """``PIL.Image``, or an ImportError naming the extra that installs it."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError(
            "ImageBatch decodes with Pillow: pip install 'asyncloader[images]' (or pillow)"
        ) from exc
    return Image


def check_known(names: tuple[str, ...]) -> None:
    """Raises ValueError for a name Pillow opens no format by, every plugin registered;
    without Pillow nothing is checked (a wrong name then fails at the first decode)."""
    try:
        Image = pillow()
    except ImportError:
        return
    Image.init()
    unknown = [name for name in names if name not in Image.OPEN]
    if unknown:
        raise ValueError(
            f"formats: Pillow opens no format named {unknown}; it opens {sorted(Image.OPEN)}"
        )


def open_image(data: Any, formats: tuple[str, ...], max_pixels: int) -> Any:
    """The Pillow image of ``data``, opened (header read, no pixel decoded) by the plugins
    of ``formats`` only, and at most ``max_pixels`` pixels."""
    Image = pillow()
    try:
        image = Image.open(io.BytesIO(data), formats=formats)
    except Image.UnidentifiedImageError as exc:
        raise Image.UnidentifiedImageError(
            f"ImageBatch: not an image of the formats it decodes ({', '.join(formats)});"
            " other formats (EPS among them) are refused unless named in formats="
        ) from exc
    try:
        width, height = image.size
        check_pixels(width, height, max_pixels)
    except Image.DecompressionBombError:
        image.close()
        raise
    return image


def check_pixels(width: int, height: int, max_pixels: int) -> None:
    """Raises Pillow's ``DecompressionBombError`` for an image over ``max_pixels``."""
    if width * height > max_pixels:
        raise pillow().DecompressionBombError(
            f"ImageBatch: the image is {width} x {height} = {width * height} pixels, over "
            f"max_pixels={max_pixels} (read from its header; nothing was decoded)"
        )

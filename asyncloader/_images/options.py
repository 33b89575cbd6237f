"""The checks of :class:`asyncloader.images.ImageBatch`'s and ``Normalize``'s arguments, each
raising with the message that names the argument.

Imports: the standard library, numpy and :mod:`asyncloader._images.pillow`; nothing else of
asyncloader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from asyncloader._images.pillow import check_known

OUTPUTS = ("float32", "uint8")
DECODERS = ("auto", "pillow")


def check_size(size: Any) -> tuple[int, int]:
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size, size)
    if (
        not isinstance(size, tuple | list)
        or len(size) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)
    ):
        raise ValueError(f"size must be a positive int or (height, width), got {size!r}")
    return int(size[0]), int(size[1])


def check_choices(
    crop: str, output: str, flip: float, center_fraction: float, decoder: str
) -> None:
    if crop not in ("random", "center"):
        raise ValueError(f"crop must be 'random' or 'center', got {crop!r}")
    if output not in OUTPUTS:
        raise ValueError(f"output must be 'float32' or 'uint8', got {output!r}")
    if not 0.0 <= float(flip) <= 1.0:
        raise ValueError(f"flip must be a probability in [0, 1], got {flip!r}")
    if not 0.0 < float(center_fraction) <= 1.0:
        raise ValueError(f"center_fraction must be in (0, 1], got {center_fraction!r}")
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be 'auto' or 'pillow', got {decoder!r}")


def check_formats(value: Any) -> tuple[str, ...]:
    """Pillow format names, upper case, each one Pillow opens (when Pillow is installed)."""
    try:
        names = (value,) if isinstance(value, str) else tuple(value)
    except TypeError:
        raise TypeError(f"formats must be a sequence of format names, got {value!r}") from None
    if not names:
        raise ValueError("formats must name at least one image format, e.g. ('JPEG', 'PNG')")
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"formats must be format names (str), got {value!r}")
    names = tuple(dict.fromkeys(name.upper() for name in names))
    check_known(names)
    return names


def check_max_pixels(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_pixels must be an int, got {type(value).__qualname__}")
    if value < 1:
        raise ValueError(f"max_pixels must be positive, got {value}")
    return value


def check_pair(name: str, value: Sequence[float]) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a pair of numbers, got {value!r}") from None
    if not 0 < low <= high:
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {value!r}")
    return low, high


def check_channels(name: str, value: Sequence[float]) -> np.ndarray:
    array = np.asarray(value, dtype=np.float32).reshape(-1)
    if array.shape != (3,):
        raise ValueError(f"{name} must hold 3 numbers (R, G, B), got {value!r}")
    return array

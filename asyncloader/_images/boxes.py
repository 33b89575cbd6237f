"""Crop geometry: the box a crop takes from an image of a given size (torchvision's random
resized crop, or a centre crop), and the reduction libjpeg may decode it at (``draft``).

Imports: the standard library; nothing of asyncloader. Randomness is Python's ``random``, which
the loader seeds per batch.
"""

from __future__ import annotations

import math
import random
from typing import Any

DRAFT_SCALES = (8, 4, 2)  # the reductions libjpeg decodes at directly


def random_resized_box(
    width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` on Python's ``random``: ``(left, top,
    right, bottom)`` of a crop covering ``scale`` of the area with aspect ``ratio`` (ten tries,
    then the centre crop closest to ``ratio``)."""
    area = width * height
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * random.uniform(*scale)
        aspect = math.exp(random.uniform(log_low, log_high))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = random.randint(0, height - h)
            left = random.randint(0, width - w)
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def center_box(width: int, height: int, fraction: float) -> tuple[int, int, int, int]:
    """The centred square of side ``fraction`` of the shorter side (``Resize(size / fraction)``
    then ``CenterCrop(size)``, as evaluation usually does)."""
    side = max(1, round(min(width, height) * fraction))
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def reduction(box: tuple[int, int, int, int], size: tuple[int, int]) -> int:
    """The largest of libjpeg's reductions (8, 4, 2) that leaves the crop ``box`` at least
    ``size`` (``(height, width)``) pixels each way; 1 when none does."""
    left, top, right, bottom = box
    out_h, out_w = size
    for s in DRAFT_SCALES:
        if (right - left) // s >= out_w and (bottom - top) // s >= out_h:
            return s
    return 1


def drafted(
    image: Any, box: tuple[int, int, int, int], width: int, height: int, size: tuple[int, int]
) -> tuple[int, int, int, int]:
    """Asks libjpeg for the largest reduction ``s`` that leaves the crop at least ``size``
    (``(height, width)``);
    returns the crop box in the reduced image's pixels, widened to whole reduced pixels
    (so by less than ``s`` pixels of the full image on each side: a box that cut reduced
    pixels would shift the crop by a fraction of a reduced pixel, visibly)."""
    left, top, right, bottom = box
    s = reduction(box, size)
    if s == 1:
        return box
    # Asking for (width // s, height // s) makes Pillow pick exactly s: the reduced image
    # is ceil(width / s) x ceil(height / s), pixel p covering full pixels [p*s, (p+1)*s).
    image.draft("RGB", (width // s, height // s))
    new_w, new_h = image.size
    if (new_w, new_h) == (-(-width // s), -(-height // s)):
        return left // s, top // s, min(new_w, -(-right // s)), min(new_h, -(-bottom // s))
    # Another scale than asked (not seen with libjpeg-turbo): the box scaled outward.
    fx, fy = new_w / width, new_h / height
    return (
        int(left * fx),
        int(top * fy),
        min(new_w, math.ceil(right * fx)),
        min(new_h, math.ceil(bottom * fy)),
    )

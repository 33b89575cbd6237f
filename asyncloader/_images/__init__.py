"""The internals of :mod:`asyncloader.images`: ``turbo`` decodes the region of a JPEG that a
crop keeps, through libjpeg-turbo's TurboJPEG 3 API (the library the optional ``turbojpeg``
wheel bundles, called with ctypes); ``pillow`` opens an image with Pillow, only by the formats
asked for and under a pixel cap; ``boxes`` draws the crop box and the reduction libjpeg may
decode it at; ``options`` checks ImageBatch's arguments; ``samples`` splits a sample into
image, label and key.

Imports: the standard library, numpy and Pillow; nothing of asyncloader. Only
:mod:`asyncloader.images` imports it; it runs in the worker processes' collate threads.
"""

from __future__ import annotations

from asyncloader._images.boxes import center_box, drafted, random_resized_box, reduction
from asyncloader._images.options import (
    check_channels,
    check_choices,
    check_formats,
    check_max_pixels,
    check_pair,
    check_size,
)
from asyncloader._images.pillow import check_pixels, open_image
from asyncloader._images.samples import split_sample
from asyncloader._images.turbo import decode_box, read_header

__all__ = [
    "center_box",
    "check_channels",
    "check_choices",
    "check_formats",
    "check_max_pixels",
    "check_pair",
    "check_pixels",
    "check_size",
    "decode_box",
    "drafted",
    "open_image",
    "random_resized_box",
    "read_header",
    "reduction",
    "split_sample",
]

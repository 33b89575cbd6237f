"""Image decoding helpers of :mod:`asyncloader.images`: ``turbo`` decodes the region of a JPEG
that a crop keeps, through libjpeg-turbo's TurboJPEG 3 API (the library the optional
``turbojpeg`` wheel bundles, called with ctypes).

Imports: the standard library and numpy; nothing of asyncloader. Only
:mod:`asyncloader.images` imports it; it runs in the worker processes' collate threads.
"""

from __future__ import annotations

from asyncloader._images.turbo import decode_box, read_header

__all__ = [
    "decode_box",
    "read_header",
]

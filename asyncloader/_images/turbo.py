"""JPEG decoding of a region only: the rows and iMCU columns that cover a crop box.

libjpeg-turbo's TurboJPEG 3 API crops while it decompresses (``tj3SetCroppingRegion``: its
``jpeg_crop_scanline`` and ``jpeg_skip_scanlines``): columns left of the region's first iMCU
and right of its last, and rows above it, are entropy-decoded (Huffman codes are read in
sequence) but not inverse-transformed, upsampled or colour-converted; rows below it are never
read. The library is the
one the ``turbojpeg`` wheel bundles (``turbojpeg.libs/libturbojpeg-*.so``), called with ctypes:
TurboJPEG reports errors by return code (its own ``setjmp`` handler), so no libjpeg error can
unwind through Python.

Invariant: :func:`decode_box` returns exactly the pixels a full decode (Pillow's, same
library defaults: accurate integer DCT, fancy upsampling) followed by the crop gives. The
region starts one pixel left of the box (rounded down to the iMCU width) and ends one pixel
right of it, so fancy upsampling, which reads one chroma sample each side, sees at the box's
edges what it sees in a full decode. Likewise one row above and one below: the first row after
``jpeg_skip_scanlines`` lands on an iMCU row's first row lacks the chroma row above it
(vertical fancy upsampling, 4:2:0 and 4:4:0), and that row is then outside the box. And at
least two iMCUs wide (or to the image's edge): libjpeg upsamples a component only two samples
wide or less without fancy upsampling, so a narrower region would change the method.
tests/integration/images/test_images.py compares the two over many boxes, sizes and subsamplings.

Everything here returns ``None`` instead of raising when the fast path cannot decode an image
(no library, not a JPEG, CMYK/YCCK, not 8-bit, a warning or an error from libjpeg): the caller
decodes it with Pillow, which raises Pillow's errors.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import threading
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

_TJINIT_DECOMPRESS = 1
_TJPARAM_SUBSAMP, _TJPARAM_JPEGWIDTH, _TJPARAM_JPEGHEIGHT = 4, 5, 6
_TJPARAM_PRECISION, _TJPARAM_COLORSPACE, _TJPARAM_LOSSLESS = 7, 8, 15
_TJCS_RGB, _TJCS_YCBCR, _TJCS_GRAY = 0, 1, 2
_TJPF_RGB = 0
#: iMCU width in pixels per TurboJPEG subsampling (444, 422, 420, GRAY, 440, 411, 441).
_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)


class _Region(ctypes.Structure):
    _fields_ = (("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int))


class Header(NamedTuple):
    """What :func:`read_header` reads of a JPEG the fast path decodes."""

    width: int
    height: int
    mcu_width: int


def _library_path() -> Path | None:
    """The libturbojpeg the ``turbojpeg`` wheel bundles, found without importing its module."""
    spec = importlib.util.find_spec("turbojpeg")
    if spec is None or spec.origin is None:
        return None
    site = Path(spec.origin).parent
    for where in (site / "turbojpeg.libs", site / ".dylibs", site / "turbojpeg" / ".dylibs"):
        found = sorted(where.glob("libturbojpeg*")) if where.is_dir() else []
        if found:
            return found[0]
    return None


def _bind(lib: Any) -> Any:
    """Declares the signatures of the functions used (ctypes would guess ``int`` for all)."""
    handle, buffer, size = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
    lib.tj3Init.restype, lib.tj3Init.argtypes = handle, [ctypes.c_int]
    lib.tj3Destroy.restype, lib.tj3Destroy.argtypes = None, [handle]
    lib.tj3Get.argtypes = [handle, ctypes.c_int]
    lib.tj3DecompressHeader.argtypes = [handle, buffer, size]
    lib.tj3SetCroppingRegion.argtypes = [handle, _Region]
    lib.tj3Decompress8.argtypes = [handle, buffer, size, buffer, ctypes.c_int, ctypes.c_int]
    return lib


@functools.cache
def library() -> Any:
    """The bound libturbojpeg (TurboJPEG 3 API, with cropped decompression), or ``None`` when
    the ``turbojpeg`` wheel is not installed or its library lacks that API. Once per process."""
    path = _library_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
        lib.tj3SetCroppingRegion  # noqa: B018 (3.0's API; its absence is an AttributeError)
        return _bind(lib)
    except (OSError, AttributeError):
        return None


class _Handle:
    """One TurboJPEG decompressor, destroyed with its thread's ``threading.local``."""

    def __init__(self, lib: Any) -> None:
        self.lib, self.ptr = lib, lib.tj3Init(_TJINIT_DECOMPRESS)
        if not self.ptr:
            raise MemoryError("tj3Init failed")

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            self.lib.tj3Destroy(self.ptr)
            self.ptr = None


_local = threading.local()


def _handle(lib: Any) -> _Handle:
    """This thread's decompressor (a TurboJPEG handle is not to be shared between threads)."""
    handle = getattr(_local, "handle", None)
    if handle is None:
        handle = _local.handle = _Handle(lib)
    return handle


def _bytes(data: Any) -> np.ndarray | None:
    """``data`` as a uint8 array (no copy: bytes and contiguous buffers); ``None`` for what is
    not one."""
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except (TypeError, ValueError, BufferError):
        return None


def read_header(data: Any) -> Header | None:
    """The size of the JPEG ``data`` when the fast path decodes it: an 8-bit lossy JPEG in
    YCbCr, RGB or grayscale with a known subsampling; otherwise ``None`` (Pillow's turn)."""
    lib = library()
    array = _bytes(data) if lib is not None else None
    if array is None or array.size < 4 or bytes(array[:3]) != b"\xff\xd8\xff":
        return None
    handle = _handle(lib)
    if lib.tj3DecompressHeader(handle.ptr, array.ctypes.data, array.size) != 0:
        return None
    get = functools.partial(lib.tj3Get, handle.ptr)
    subsampling = get(_TJPARAM_SUBSAMP)
    if (
        get(_TJPARAM_PRECISION) != 8
        or get(_TJPARAM_LOSSLESS) == 1
        or get(_TJPARAM_COLORSPACE) not in (_TJCS_RGB, _TJCS_YCBCR, _TJCS_GRAY)
        or not 0 <= subsampling < len(_MCU_WIDTH)
    ):
        return None
    return Header(get(_TJPARAM_JPEGWIDTH), get(_TJPARAM_JPEGHEIGHT), _MCU_WIDTH[subsampling])


def decode_box(data: Any, header: Header, box: tuple[int, int, int, int]) -> np.ndarray | None:
    """The RGB pixels of ``box`` (``(left, top, right, bottom)``, inside the image) of the JPEG
    ``data`` whose :func:`read_header` is ``header``: ``uint8 [bottom - top, right - left, 3]``,
    a view of the decoded region; ``None`` when libjpeg reports a warning or an error."""
    lib, array = library(), _bytes(data)
    if lib is None or array is None:
        return None
    left, top, right, bottom = box
    x0 = max(left - 1, 0) // header.mcu_width * header.mcu_width
    x1 = min(max(right + 1, x0 + 2 * header.mcu_width), header.width)
    y0, y1 = max(top - 1, 0), min(bottom + 1, header.height)
    region = np.empty((y1 - y0, x1 - x0, 3), dtype=np.uint8)
    handle, src = _handle(lib), array.ctypes.data
    # The header read again, so that the region is checked against this image's header
    # whatever this thread's handle read last.
    if (
        lib.tj3DecompressHeader(handle.ptr, src, array.size) != 0
        or lib.tj3SetCroppingRegion(handle.ptr, _Region(x0, y0, x1 - x0, y1 - y0)) != 0
        or lib.tj3Decompress8(
            handle.ptr, src, array.size, region.ctypes.data, region.strides[0], _TJPF_RGB
        )
        != 0
    ):
        return None
    return region[top - y0 : bottom - y0, left - x0 : right - x0]

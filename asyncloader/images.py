"""Image batches made where they are decoded: the recommended pipeline for training on images.

:class:`ImageBatch` is a ``collate_fn``. Given a batch's encoded images (JPEG, PNG or WebP;
``formats=`` widens that), it decodes each one, takes a random resized crop (torchvision's
``RandomResizedCrop`` rule), flips it at random and writes it straight into its slot of one
batch tensor, normalised ``float32`` or raw ``uint8``. In a worker that tensor is allocated in
shared memory, so the batch leaves the worker without another copy
(:func:`asyncloader._worker.buffers.batch_tensor`). Used as::

    loader = AsyncLoader(
        ShardedSource(shard_urls),  # or ObjectStoreSource / HTTPSource over one image each
        batch_size=64, num_workers=2, fetch_in_workers=True,
        collate_fn=ImageBatch(224),
    )
    for images, labels in loader:  # float32 [64, 3, 224, 224], int64 [64]
        ...

With ``output="uint8"`` the batch is four times smaller and the normalisation moves to the
device stage: ``AsyncLoader(..., device="cuda", device_transform=Normalize())``, where it is one
fused kernel on the GPU.

Where the time goes per image, and what this does about it (one thread): the crop box is drawn
from the header's size, then a JPEG is decoded only where the crop is (libjpeg-turbo's
cropped decompression, the ``turbojpeg`` wheel of the ``images`` extra: rows below the box are
never read, rows above it and columns outside it are entropy-decoded only), with the pixels a
full decode would give; without that wheel, or for what it cannot decode, Pillow decodes the
whole image. The crop is resized by torch's antialiased bilinear ``uint8`` kernel (the one
torchvision's v2 transforms use: about 3x faster than Pillow's ``resize`` here, equal to it
within rounding); flip, ``uint8 -> float``, ``/255``, ``- mean``, ``/ std`` and ``HWC -> CHW``
are two numpy passes that write into the batch tensor.

Randomness comes from Python's ``random`` module, which the loader seeds per batch, so crops and
flips repeat with the same seed whatever the number of workers.
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from asyncloader._images import decode_box, read_header
from asyncloader._worker import batch_tensor, empty_huge, shares_batches

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: What :class:`ImageBatch` decodes unless ``formats=`` says otherwise (Pillow's names).
DEFAULT_FORMATS = ("JPEG", "PNG", "WEBP")
#: The most pixels (width x height, from the header) :class:`ImageBatch` decodes by default:
#: 8192 x 8192, about 200 MB as RGB (below Pillow's own warning at ~89.5 MP).
DEFAULT_MAX_PIXELS = 8192 * 8192

_OUTPUTS = {"float32": torch.float32, "uint8": torch.uint8}
_DECODERS = ("auto", "pillow")
_DRAFT_SCALES = (8, 4, 2)  # the reductions libjpeg decodes at directly


def _pillow() -> Any:
    """``PIL.Image``, or an ImportError naming the extra that installs it."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError(
            "ImageBatch decodes with Pillow: pip install 'asyncloader[images]' (or pillow)"
        ) from exc
    return Image


def _size(size: Any) -> tuple[int, int]:
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size, size)
    if (
        not isinstance(size, tuple | list)
        or len(size) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)
    ):
        raise ValueError(f"size must be a positive int or (height, width), got {size!r}")
    return int(size[0]), int(size[1])


def _check_choices(
    crop: str, output: str, flip: float, center_fraction: float, decoder: str
) -> None:
    if crop not in ("random", "center"):
        raise ValueError(f"crop must be 'random' or 'center', got {crop!r}")
    if output not in _OUTPUTS:
        raise ValueError(f"output must be 'float32' or 'uint8', got {output!r}")
    if not 0.0 <= float(flip) <= 1.0:
        raise ValueError(f"flip must be a probability in [0, 1], got {flip!r}")
    if not 0.0 < float(center_fraction) <= 1.0:
        raise ValueError(f"center_fraction must be in (0, 1], got {center_fraction!r}")
    if decoder not in _DECODERS:
        raise ValueError(f"decoder must be 'auto' or 'pillow', got {decoder!r}")


def _formats(value: Any) -> tuple[str, ...]:
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
    _check_known(names)
    return names


def _check_known(names: tuple[str, ...]) -> None:
    """Raises ValueError for a name Pillow opens no format by, every plugin registered;
    without Pillow nothing is checked (a wrong name then fails at the first decode)."""
    try:
        Image = _pillow()
    except ImportError:
        return
    Image.init()
    unknown = [name for name in names if name not in Image.OPEN]
    if unknown:
        raise ValueError(
            f"formats: Pillow opens no format named {unknown}; it opens {sorted(Image.OPEN)}"
        )


def _max_pixels(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_pixels must be an int, got {type(value).__qualname__}")
    if value < 1:
        raise ValueError(f"max_pixels must be positive, got {value}")
    return value


def _pair(name: str, value: Sequence[float]) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a pair of numbers, got {value!r}") from None
    if not 0 < low <= high:
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {value!r}")
    return low, high


def _channels(name: str, value: Sequence[float]) -> np.ndarray:
    array = np.asarray(value, dtype=np.float32).reshape(-1)
    if array.shape != (3,):
        raise ValueError(f"{name} must hold 3 numbers (R, G, B), got {value!r}")
    return array


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


class ImageBatch:
    """A ``collate_fn`` that decodes, crops, flips and normalises images into one batch tensor.

    Args:
        size: Output side in pixels (square), or ``(height, width)``.
        crop: ``"random"``: torchvision's ``RandomResizedCrop(size, scale, ratio)``;
            ``"center"``: the centred square of ``center_fraction`` of the shorter side
            (evaluation: ``Resize(256)`` + ``CenterCrop(224)`` is ``center_fraction=224/256``).
        scale, ratio: ``RandomResizedCrop``'s area fraction and aspect-ratio ranges.
        flip: Probability of a horizontal flip.
        output: ``"float32"``: ``(pixel / 255 - mean) / std``; ``"uint8"``: pixels as they
            are, to normalise later (:class:`Normalize` on the device stage).
        mean, std: Per channel (RGB), on the 0-1 scale.
        draft: Decode JPEGs at 1/2, 1/4 or 1/8 of their size when the crop still has at least
            ``size`` pixels each way at that scale (libjpeg's DCT scaling: far less decoding
            for large photos). Two effects on pixels: the crop box is widened to the reduced
            image's pixel grid (by less than the reduction, in full-size pixels, per side),
            and the DCT-domain reduction is a slightly different filter than decoding in full
            and resizing (mean difference under 1 of 255 on the tests' photos). A crop smaller
            than twice ``size`` each way is decoded in full, unchanged: so images not much
            larger than ``size`` (ImageNet's ~400 x 350 at 224) are never reduced.
        decoder: ``"auto"``: a JPEG is decoded only where its crop is (the rows and iMCU
            columns that cover the box; libjpeg-turbo's cropped decompression, from the
            optional ``turbojpeg`` wheel of the ``images`` extra), with the same pixels as a
            full decode; without that wheel, and for other formats, CMYK or non-8-bit JPEGs
            and crops ``draft`` reduces, Pillow decodes the whole image. ``"pillow"``: Pillow
            always.
        image_key, label_key: The fields of a dict sample (a ``ShardedSource`` sample is
            ``{"__key__", "jpg": bytes, "cls": b"3"}``); ``image_key`` may be a tuple of
            alternatives (``("jpg", "jpeg", "png")``).
        formats: The Pillow formats decoded (default JPEG, PNG, WebP); bytes of any other
            format are refused before Pillow's loader for it runs (EPS's runs Ghostscript).
        max_pixels: The most pixels (width x height, read from the header before anything is
            decoded) of an image; a larger one is refused. Independent of Pillow's global
            ``MAX_IMAGE_PIXELS``, which is left as it is (and still applies).

    A sample is the encoded image (bytes-like), a ``(image, label)`` pair, or a dict. Returns
    ``images`` (``[B, 3, H, W]``), or ``(images, labels)`` (``int64 [B]``) when the samples
    carry labels (a dict with ``label_key``, or a pair). Inside a worker, ``images`` is
    allocated in shared memory. A sample that fails to decode raises Pillow's error with a note
    naming its place in the batch (and key): ``UnidentifiedImageError`` for a format not in
    ``formats``, ``DecompressionBombError`` for one over ``max_pixels``. Collate errors fail
    their batch; to skip such samples with ``on_error="skip"``, pass :meth:`check` as the
    loader's ``transform``.
    """

    def __init__(
        self,
        size: int | tuple[int, int] = 224,
        *,
        crop: str = "random",
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        center_fraction: float = 0.875,
        flip: float = 0.5,
        output: str = "float32",
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        draft: bool = False,
        decoder: str = "auto",
        image_key: str | tuple[str, ...] = ("jpg", "jpeg", "png", "webp"),
        label_key: str | None = "cls",
        formats: Sequence[str] = DEFAULT_FORMATS,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        self.size = _size(size)
        _check_choices(crop, output, flip, center_fraction, decoder)
        std_array = _channels("std", std)
        if (std_array <= 0).any():
            raise ValueError(f"std must be positive, got {std!r}")
        self.crop = crop
        self.scale = _pair("scale", scale)
        self.ratio = _pair("ratio", ratio)
        self.center_fraction = float(center_fraction)
        self.flip = float(flip)
        self.output = output
        self.mean = tuple(float(m) for m in _channels("mean", mean))
        self.std = tuple(float(s) for s in std_array)
        self.draft = bool(draft)
        self.decoder = decoder
        self.image_keys = (image_key,) if isinstance(image_key, str) else tuple(image_key)
        self.label_key = label_key
        self.formats = _formats(formats)
        self.max_pixels = _max_pixels(max_pixels)
        # float output = pixel * gain + bias, per channel, shaped to broadcast over CHW.
        self._gain = (1.0 / (255.0 * std_array)).astype(np.float32)[:, None, None]
        self._bias = (-_channels("mean", mean) / std_array).astype(np.float32)[:, None, None]

    def __repr__(self) -> str:
        return (
            f"ImageBatch(size={self.size}, crop={self.crop!r}, output={self.output!r}, "
            f"flip={self.flip}, draft={self.draft}, decoder={self.decoder!r})"
        )

    def __call__(self, samples: Sequence[Any]) -> Any:
        n = len(samples)
        if n == 0:
            raise ValueError("ImageBatch got an empty batch")
        height, width = self.size
        shape = (n, 3, height, width)
        dtype = _OUTPUTS[self.output]
        images = batch_tensor(shape, dtype) if shares_batches() else empty_huge(shape, dtype)
        slots = images.numpy()
        labels: list[int] = []
        for i, sample in enumerate(samples):
            data, label, key = self._parts(sample, f"sample {i}")
            try:
                self._write(data, slots[i])
            except Exception as exc:
                where = f"sample {i} of the batch" + (f" (key {key!r})" if key else "")
                exc.add_note(f"asyncloader.images.ImageBatch: {where}")
                raise
            if label is not None:
                labels.append(label)
        if not labels:
            return images
        if len(labels) != n:
            raise ValueError("ImageBatch: some samples of the batch carry a label, others do not")
        return images, torch.tensor(labels, dtype=torch.int64)

    def check(self, sample: Any) -> Any:
        """Returns ``sample`` unchanged once its image's header shows a format in ``formats``
        and at most ``max_pixels`` pixels; raises as :meth:`__call__` would for it, without
        decoding any pixel. As the loader's ``transform`` with ``on_error="skip"``, a refused
        image is left out of its batch instead of failing the batch."""
        data, _, _ = self._parts(sample, "the sample")
        self._open(data).close()
        return sample

    def _parts(self, sample: Any, name: str) -> tuple[Any, int | None, str | None]:
        """``(encoded image, label or None, key or None)`` of one sample (``name`` says which,
        in errors)."""
        if isinstance(sample, bytes | bytearray | memoryview):
            return sample, None, None
        if isinstance(sample, tuple | list) and len(sample) == 2:
            return sample[0], _label(sample[1]), None
        if isinstance(sample, dict):
            for key in self.image_keys:
                if key in sample:
                    label = None
                    if self.label_key is not None and self.label_key in sample:
                        label = _label(sample[self.label_key])
                    return sample[key], label, sample.get("__key__")
            raise KeyError(
                f"ImageBatch: {name} has none of the image fields {self.image_keys} "
                f"(it has {sorted(sample)}); set image_key"
            )
        raise TypeError(
            f"ImageBatch: {name} is a {type(sample).__qualname__}; expected encoded image "
            "bytes, an (image, label) pair or a dict"
        )

    def _open(self, data: Any) -> Any:
        """The Pillow image of ``data``, opened (header read, no pixel decoded) by the plugins
        of ``formats`` only, and at most ``max_pixels`` pixels."""
        Image = _pillow()
        try:
            image = Image.open(io.BytesIO(data), formats=self.formats)
        except Image.UnidentifiedImageError as exc:
            raise Image.UnidentifiedImageError(
                f"ImageBatch: not an image of the formats it decodes ({', '.join(self.formats)});"
                " other formats (EPS among them) are refused unless named in formats="
            ) from exc
        try:
            self._check_pixels(*image.size)
        except Image.DecompressionBombError:
            image.close()
            raise
        return image

    def _check_pixels(self, width: int, height: int) -> None:
        """Raises Pillow's ``DecompressionBombError`` for an image over ``max_pixels``."""
        if width * height > self.max_pixels:
            raise _pillow().DecompressionBombError(
                f"ImageBatch: the image is {width} x {height} = {width * height} pixels, over "
                f"max_pixels={self.max_pixels} (read from its header; nothing was decoded)"
            )

    def _write(self, data: Any, slot: np.ndarray) -> None:
        """Decodes one image and writes it, cropped, resized, flipped and converted, into
        ``slot`` (``[3, H, W]``)."""
        crop = self._crop(data)
        region = torch.from_numpy(crop).permute(2, 0, 1)[None]
        resized = F.interpolate(
            region, size=self.size, mode="bilinear", antialias=True, align_corners=False
        )[0].numpy()  # CHW view of HWC memory
        if self.flip and random.random() < self.flip:
            resized = resized[:, :, ::-1]
        if self.output == "uint8":
            np.copyto(slot, resized)
        else:
            np.multiply(resized, self._gain, out=slot, casting="unsafe")
            np.add(slot, self._bias, out=slot)

    def _crop(self, data: Any) -> np.ndarray:
        """The crop of one image, ``uint8`` HWC, a contiguous copy (channels-last memory,
        which torch's fast ``uint8`` antialiased kernel wants, and writable, which
        ``torch.from_numpy`` wants). A JPEG is decoded only where the crop is
        (:mod:`asyncloader._images.turbo`) when libturbojpeg is installed and can decode it;
        otherwise, or when ``draft`` reduces this crop, Pillow decodes the whole image. The box
        is drawn once, from the header's size, before either decode: the same draws as
        Pillow's path, so a seed gives the same crops with or without libturbojpeg."""
        fast = self.decoder == "auto" and "JPEG" in self.formats
        header = read_header(data) if fast else None
        if header is None:
            return self._pillow_crop(data, None)
        self._check_pixels(header.width, header.height)
        box = self._box(header.width, header.height)
        if not self.draft or _reduction(box, self.size) == 1:
            pixels = decode_box(data, header, box)
            if pixels is not None:
                return pixels.copy()
        return self._pillow_crop(data, box)

    def _box(self, width: int, height: int) -> tuple[int, int, int, int]:
        if self.crop == "random":
            return random_resized_box(width, height, self.scale, self.ratio)
        return center_box(width, height, self.center_fraction)

    def _pillow_crop(self, data: Any, box: tuple[int, int, int, int] | None) -> np.ndarray:
        """:meth:`_crop` by Pillow: the whole image decoded (at a reduced size with
        ``draft``), then cropped; ``box`` is drawn here when not given."""
        image = self._open(data)
        width, height = image.size
        if box is None:
            box = self._box(width, height)
        if self.draft and image.format == "JPEG":
            box = self._drafted(image, box, width, height)
        if image.mode != "RGB":
            image = image.convert("RGB")
        left, top, right, bottom = box
        return np.asarray(image)[top:bottom, left:right].copy()

    def _drafted(
        self, image: Any, box: tuple[int, int, int, int], width: int, height: int
    ) -> tuple[int, int, int, int]:
        """Asks libjpeg for the largest reduction ``s`` that leaves the crop at least ``size``;
        returns the crop box in the reduced image's pixels, widened to whole reduced pixels
        (so by less than ``s`` pixels of the full image on each side: a box that cut reduced
        pixels would shift the crop by a fraction of a reduced pixel, visibly)."""
        left, top, right, bottom = box
        s = _reduction(box, self.size)
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


def _reduction(box: tuple[int, int, int, int], size: tuple[int, int]) -> int:
    """The largest of libjpeg's reductions (8, 4, 2) that leaves the crop ``box`` at least
    ``size`` (``(height, width)``) pixels each way; 1 when none does."""
    left, top, right, bottom = box
    out_h, out_w = size
    for s in _DRAFT_SCALES:
        if (right - left) // s >= out_w and (bottom - top) // s >= out_h:
            return s
    return 1


def _label(value: Any) -> int:
    if isinstance(value, bytes | bytearray):
        return int(value.decode().strip())
    if isinstance(value, str):
        return int(value.strip())
    return int(value)


class Normalize:
    """A ``device_transform`` that turns ``uint8`` image batches into normalised ``float32``:
    ``(pixel / 255 - mean) / std`` per channel, on the device the batch is on.

    The batch is the images tensor, or a tuple/list whose first element is (what
    :class:`ImageBatch` returns); anything else is returned unchanged.
    """

    def __init__(
        self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
    ) -> None:
        std_array = _channels("std", std)
        if (std_array <= 0).any():
            raise ValueError(f"std must be positive, got {std!r}")
        gain = 1.0 / (255.0 * std_array)
        bias = -_channels("mean", mean) / std_array
        self._gain = torch.from_numpy(gain.astype(np.float32)).view(1, 3, 1, 1)
        self._bias = torch.from_numpy(bias.astype(np.float32)).view(1, 3, 1, 1)
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._on:
            self._on[device] = (self._gain.to(device), self._bias.to(device))
        return self._on[device]

    def images(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (``uint8 [B, 3, H, W]``) normalised as ``float32``; other tensors unchanged."""
        if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != 3:
            return x
        gain, bias = self._constants(x.device)
        if x.device.type != "cpu":
            return torch.addcmul(bias, x.to(torch.float32), gain)
        out = empty_huge(tuple(x.shape), torch.float32).copy_(x)
        # In place on float32: addcmul of mixed dtypes takes a slow path (4x here).
        return torch.addcmul(bias, out, gain, out=out)

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return self.images(batch)
        if isinstance(batch, tuple | list) and batch and isinstance(batch[0], torch.Tensor):
            return type(batch)([self.images(batch[0]), *batch[1:]])
        return batch

    def __repr__(self) -> str:
        return "Normalize()"

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

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from asyncloader._images import (
    center_box,
    check_channels,
    check_choices,
    check_formats,
    check_max_pixels,
    check_pair,
    check_pixels,
    check_size,
    decode_box,
    drafted,
    open_image,
    random_resized_box,
    read_header,
    reduction,
    split_sample,
)
from asyncloader._worker import batch_tensor, empty_huge, shares_batches

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: What :class:`ImageBatch` decodes unless ``formats=`` says otherwise (Pillow's names).
DEFAULT_FORMATS = ("JPEG", "PNG", "WEBP")
#: The most pixels (width x height, from the header) :class:`ImageBatch` decodes by default:
#: 8192 x 8192, about 200 MB as RGB (below Pillow's own warning at ~89.5 MP).
DEFAULT_MAX_PIXELS = 8192 * 8192

_OUTPUTS = {"float32": torch.float32, "uint8": torch.uint8}


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
        self.size = check_size(size)
        check_choices(crop, output, flip, center_fraction, decoder)
        std_array = check_channels("std", std)
        if (std_array <= 0).any():
            raise ValueError(f"std must be positive, got {std!r}")
        self.crop = crop
        self.scale = check_pair("scale", scale)
        self.ratio = check_pair("ratio", ratio)
        self.center_fraction = float(center_fraction)
        self.flip = float(flip)
        self.output = output
        self.mean = tuple(float(m) for m in check_channels("mean", mean))
        self.std = tuple(float(s) for s in std_array)
        self.draft = bool(draft)
        self.decoder = decoder
        self.image_keys = (image_key,) if isinstance(image_key, str) else tuple(image_key)
        self.label_key = label_key
        self.formats = check_formats(formats)
        self.max_pixels = check_max_pixels(max_pixels)
        # float output = pixel * gain + bias, per channel, shaped to broadcast over CHW.
        self._gain = (1.0 / (255.0 * std_array)).astype(np.float32)[:, None, None]
        self._bias = (-check_channels("mean", mean) / std_array).astype(np.float32)[:, None, None]

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
            data, label, key = split_sample(sample, f"sample {i}", self.image_keys, self.label_key)
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
        data, _, _ = split_sample(sample, "the sample", self.image_keys, self.label_key)
        self._open(data).close()
        return sample

    def _open(self, data: Any) -> Any:
        """The Pillow image of ``data``, opened (header read, no pixel decoded) by the plugins
        of ``formats`` only, and at most ``max_pixels`` pixels."""
        return open_image(data, self.formats, self.max_pixels)

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
        check_pixels(header.width, header.height, self.max_pixels)
        box = self._box(header.width, header.height)
        if not self.draft or reduction(box, self.size) == 1:
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
            box = drafted(image, box, width, height, self.size)
        if image.mode != "RGB":
            image = image.convert("RGB")
        left, top, right, bottom = box
        return np.asarray(image)[top:bottom, left:right].copy()


class Normalize:
    """A ``device_transform`` that turns ``uint8`` image batches into normalised ``float32``:
    ``(pixel / 255 - mean) / std`` per channel, on the device the batch is on.

    The batch is the images tensor, or a tuple/list whose first element is (what
    :class:`ImageBatch` returns); anything else is returned unchanged.
    """

    def __init__(
        self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
    ) -> None:
        std_array = check_channels("std", std)
        if (std_array <= 0).any():
            raise ValueError(f"std must be positive, got {std!r}")
        gain = 1.0 / (255.0 * std_array)
        bias = -check_channels("mean", mean) / std_array
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

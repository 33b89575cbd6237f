"""asyncloader.images: ImageBatch (decode, crop, flip, normalise into one batch tensor),
Normalize, and the loader's device_transform that runs it."""

import io
import random
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image, UnidentifiedImageError

import asyncloader.images as images_module
from asyncloader import AsyncLoader
from asyncloader._images import drafted, turbo
from asyncloader.images import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageBatch,
    Normalize,
    center_box,
    random_resized_box,
)
from examples.image_data import make_images

pytestmark = pytest.mark.timeout(60)

IMAGES = make_images(12, seed=5)


def as_dicts(images=IMAGES):
    return [{"__key__": k, "jpg": b, "cls": str(label).encode()} for k, b, label in images]


def jpeg(width, height, seed=0):
    """A smooth JPEG of the given size (large images for the draft tests)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (height // 32 + 1, width // 32 + 1, 3), dtype=np.uint8)
    pixels = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC))
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=95)
    return out.getvalue()


def test_dict_pair_and_bytes_samples():
    images, labels = ImageBatch(32)(as_dicts())
    assert images.shape == (12, 3, 32, 32) and images.dtype == torch.float32
    assert labels.tolist() == [label for _, _, label in IMAGES]
    pairs = [(b, label) for _, b, label in IMAGES]
    assert ImageBatch(32)(pairs)[1].tolist() == labels.tolist()
    only = ImageBatch((24, 40), output="uint8")([b for _, b, _ in IMAGES])
    assert isinstance(only, torch.Tensor)
    assert only.shape == (12, 3, 24, 40) and only.dtype == torch.uint8


def test_the_same_seed_gives_the_same_crops_and_flips():
    def run(seed):
        random.seed(seed)
        return ImageBatch(32)(as_dicts())[0]

    assert torch.equal(run(1), run(1))
    assert not torch.equal(run(1), run(2))


def test_float_output_is_the_uint8_output_normalised():
    random.seed(3)
    floats = ImageBatch(32)(as_dicts())[0]
    random.seed(3)
    raw, labels = ImageBatch(32, output="uint8")(as_dicts())
    normalised, same_labels = Normalize()((raw, labels))
    assert normalised.dtype == torch.float32
    assert torch.allclose(floats, normalised, atol=1e-5)
    assert same_labels is labels
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert torch.allclose(floats, (raw / 255 - mean) / std, atol=1e-5)


@pytest.mark.parametrize("box", [(20, 10, 300, 230), (40, 30, 140, 110)])
def test_resize_matches_pillow_bilinear_within_rounding(monkeypatch, box):
    """torch's antialiased uint8 kernel in place of Pillow's BILINEAR resize: the same pixels
    up to rounding, downscaling (280 -> 64) and upscaling (100 -> 128)."""
    data = IMAGES[0][1]
    side = 64 if box[2] - box[0] > 200 else 128
    monkeypatch.setattr(images_module, "center_box", lambda *_: box)
    got = ImageBatch(side, crop="center", flip=0.0, output="uint8")([data])
    image = Image.open(io.BytesIO(data)).convert("RGB")
    expected = np.asarray(image.resize((side, side), Image.BILINEAR, box=box))
    diff = np.abs(got[0].permute(1, 2, 0).numpy().astype(int) - expected.astype(int))
    assert diff.mean() < 0.5 and diff.max() <= 12


def test_random_resized_box_follows_torchvision_rule():
    random.seed(0)
    for _ in range(2000):
        width, height = random.randint(20, 600), random.randint(20, 600)
        left, top, right, bottom = random_resized_box(width, height, (0.08, 1.0), (0.75, 4 / 3))
        assert 0 <= left < right <= width and 0 <= top < bottom <= height
        w, h = right - left, bottom - top
        # Rounding moves the ratio a little on tiny crops; the fallback clamps to the range.
        assert 0.75 * 0.8 <= w / h <= 4 / 3 * 1.25 or (w, h) == (width, height)


def test_flip_mirrors_the_crop():
    data = IMAGES[0][1]
    plain = ImageBatch(32, crop="center", flip=0.0, output="uint8")([data])
    flipped = ImageBatch(32, crop="center", flip=1.0, output="uint8")([data])
    assert torch.equal(flipped, plain.flip(3))


def test_draft_decodes_large_images_smaller_with_close_pixels():
    """A 1050-pixel centre crop of a 1600 x 1200 photo is decoded at 1/4: the box widens to
    the 4-pixel grid, and the pixels stay within 1 of 255 on average of a full decode of that
    box."""
    big = jpeg(1600, 1200)
    assert center_box(1600, 1200, 0.875) == (275, 75, 1325, 1125)
    drafted = ImageBatch(224, crop="center", flip=0.0, output="uint8", draft=True)([big])
    full = Image.open(io.BytesIO(big)).convert("RGB")
    expected = np.asarray(full.resize((224, 224), Image.BILINEAR, box=(272, 72, 1328, 1128)))
    diff = np.abs(drafted[0].permute(1, 2, 0).numpy().astype(int) - expected.astype(int))
    assert 0 < diff.mean() < 1.0
    small = IMAGES[0][1]  # a crop under 2 x 224: decoded in full either way
    args = {"crop": "center", "flip": 0.0, "output": "uint8"}
    plain, drafted = ImageBatch(224, **args), ImageBatch(224, draft=True, **args)
    assert torch.equal(plain([small]), drafted([small]))


def test_a_bad_image_names_its_sample():
    samples = as_dicts()[:3]
    samples[2] = {**samples[2], "jpg": b"not an image"}
    with pytest.raises(Exception) as info:
        ImageBatch(32)(samples)
    notes = info.value.__notes__
    assert any("sample 2 of the batch" in note and "000002" in note for note in notes)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": 0}, "size"),
        ({"crop": "middle"}, "crop"),
        ({"output": "float16"}, "output"),
        ({"flip": 2}, "flip"),
        ({"scale": (0.5, 0.1)}, "scale"),
        ({"std": (1, 0, 1)}, "std"),
        ({"mean": (1, 2)}, "mean"),
        ({"decoder": "simd"}, "decoder"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ImageBatch(**kwargs)


def test_samples_of_one_kind_are_required():
    with pytest.raises(TypeError, match="sample 0"):
        ImageBatch(32)([123])
    with pytest.raises(KeyError, match="image_key"):
        ImageBatch(32)([{"png2": b""}])


class Checked:
    """A collate_fn that reports whether ImageBatch allocated its batch in shared memory."""

    def __init__(self):
        self.batch = ImageBatch(32)

    def __call__(self, samples):
        images, labels = self.batch(samples)
        return images, labels, torch.tensor(images.is_shared())


def test_in_workers_the_batch_is_born_in_shared_memory_and_repeats():
    pairs = [(b, i) for i, (_, b, _) in enumerate(IMAGES)]

    def epoch(workers, collate):
        loader = AsyncLoader(
            pairs,
            batch_size=4,
            shuffle=True,
            num_workers=workers,
            collate_fn=collate,
            generator=torch.Generator().manual_seed(0),
        )
        return list(loader)

    checked = epoch(2, Checked())
    assert all(bool(shared) for _, _, shared in checked)
    assert sorted(i for _, labels, _ in checked for i in labels.tolist()) == list(range(12))
    one, two = epoch(1, ImageBatch(32)), epoch(2, ImageBatch(32))
    for a, b in zip(one, two, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_device_transform_runs_on_each_batch():
    pairs = [(b, i) for i, (_, b, _) in enumerate(IMAGES)]
    loader = AsyncLoader(
        pairs,
        batch_size=4,
        collate_fn=ImageBatch(32, output="uint8"),
        device_transform=Normalize(),
    )
    batches = list(loader)
    assert [images.dtype for images, _ in batches] == [torch.float32] * 3
    assert sorted(i for _, labels in batches for i in labels.tolist()) == list(range(12))


class Boom(RuntimeError):
    pass


def explode(batch):
    raise Boom("device transform failed")


def test_device_transform_errors_keep_their_type_and_name_the_stage():
    loader = AsyncLoader(list(range(8)), batch_size=4, device_transform=explode)
    with pytest.raises(Boom) as info:
        list(loader)
    assert any("stage=device" in note for note in info.value.__notes__)


def test_device_transform_must_be_callable():
    with pytest.raises(TypeError, match="device_transform"):
        AsyncLoader(list(range(8)), device_transform=3)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_uint8_batches_are_normalised_on_the_gpu_as_on_the_cpu():
    """device_transform runs on the device thread's stream after the copy; the batch the
    consumer gets is float32 on the GPU and equals the CPU pipeline's."""
    pairs = [(b, i) for i, (_, b, _) in enumerate(IMAGES)]

    def epoch(**options):
        loader = AsyncLoader(
            pairs,
            batch_size=4,
            collate_fn=ImageBatch(32, output="uint8"),
            device_transform=Normalize(),
            generator=torch.Generator().manual_seed(0),
            shuffle=True,
            **options,
        )
        return list(loader)

    on_gpu, on_cpu = epoch(device="cuda"), epoch()
    for (gpu_images, gpu_labels), (cpu_images, cpu_labels) in zip(on_gpu, on_cpu, strict=True):
        assert gpu_images.is_cuda and gpu_images.dtype == torch.float32
        assert torch.allclose(gpu_images.cpu(), cpu_images, atol=1e-5)
        assert torch.equal(gpu_labels.cpu(), cpu_labels)


class Drafted:
    """A stand-in for a Pillow JPEG whose draft() reduces to a given size."""

    def __init__(self, size, reduced):
        self.size, self._reduced = size, reduced

    def draft(self, mode, requested):
        self.size = self._reduced


def test_draft_boxes_map_onto_the_reduced_image():
    batch = ImageBatch(224, draft=True)
    # The expected 1/4 scale: whole reduced pixels, widened outward.
    image = Drafted((1600, 1200), (400, 300))
    assert drafted(image, (275, 75, 1325, 1125), 1600, 1200, batch.size) == (68, 18, 332, 282)
    # Another scale than asked: the box is scaled by the actual factors, outward, clipped.
    image = Drafted((1600, 1200), (533, 400))
    left, top, right, bottom = drafted(image, (275, 75, 1325, 1125), 1600, 1200, batch.size)
    assert (left, top) == (91, 25) and right == 442 and bottom == 375
    # A crop too small to reduce: the box is unchanged and nothing is asked of the decoder.
    image = Drafted((400, 300), (0, 0))
    assert drafted(image, (10, 10, 300, 250), 400, 300, batch.size) == (10, 10, 300, 250)
    assert image.size == (400, 300)


# The formats decoded by default, and a pixel cap of ImageBatch's own.


def png_declaring(width, height):
    """A tiny real PNG whose header (IHDR) declares ``width`` x ``height``: Pillow reads that
    size at open; decoding it would allocate for the declared size."""
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(out, "PNG")
    data = bytearray(out.getvalue())
    assert data[12:16] == b"IHDR"
    data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\nshowpage\n"


def image_bytes(fmt, size=(16, 12)):
    out = io.BytesIO()
    Image.new("RGB", size, (200, 100, 50)).save(out, fmt)
    return out.getvalue()


def test_an_eps_file_is_refused_without_running_ghostscript(monkeypatch):
    """EPS is not decoded by default: Pillow's EPS loader (which runs Ghostscript) is never
    reached, whether gs is installed or not."""
    from PIL import EpsImagePlugin

    assert Image.open(io.BytesIO(EPS)).format == "EPS"  # Pillow alone would take it
    ran = []

    def ghostscript(*args, **kwargs):
        ran.append(args)
        raise RuntimeError("Ghostscript ran on a sample's bytes")

    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", ghostscript)
    monkeypatch.setattr(EpsImagePlugin, "has_ghostscript", lambda: True)
    with pytest.raises(UnidentifiedImageError, match="JPEG, PNG, WEBP") as info:
        ImageBatch(32)([{"__key__": "evil", "jpg": EPS}])
    assert ran == []
    assert any("sample 0 of the batch" in n and "evil" in n for n in info.value.__notes__)


def test_formats_widens_what_is_decoded():
    bmp, gif = image_bytes("BMP"), image_bytes("GIF")
    with pytest.raises(UnidentifiedImageError, match="formats="):
        ImageBatch(8)([bmp])
    wide = ImageBatch(8, output="uint8", formats=("jpeg", "png", "webp", "bmp", "GIF"))
    assert wide([bmp, gif, image_bytes("WEBP")]).shape == (3, 3, 8, 8)
    assert ImageBatch(8, formats="BMP")([bmp]).shape == (1, 3, 8, 8)


def test_an_image_over_max_pixels_is_refused_from_its_header(monkeypatch):
    """A 13000 x 13000 PNG header is refused before any pixel is decoded, whatever Pillow's
    global MAX_IMAGE_PIXELS says (here: no limit), and that global is left as it was."""
    from PIL import ImageFile

    real_load = ImageFile.ImageFile.load

    def load(self, *args, **kwargs):
        assert self.size == (16, 12), f"decoding started for a {self.size} image"
        return real_load(self, *args, **kwargs)

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    samples = [{"__key__": "k0", "png": image_bytes("PNG")}, {"__key__": "bomb"}]
    samples[1]["png"] = png_declaring(13000, 13000)
    with pytest.raises(Image.DecompressionBombError, match=r"13000 x 13000.*max_pixels") as info:
        ImageBatch(32)(samples)
    assert any("sample 1 of the batch" in n and "bomb" in n for n in info.value.__notes__)
    assert Image.MAX_IMAGE_PIXELS is None


def test_max_pixels_is_a_cap_of_its_own():
    data = image_bytes("PNG", (16, 12))  # 192 pixels
    assert ImageBatch(8, max_pixels=192)([data]).shape == (1, 3, 8, 8)
    with pytest.raises(Image.DecompressionBombError, match="16 x 12 = 192 pixels"):
        ImageBatch(8, max_pixels=191)([data])
    big = png_declaring(8192, 8193)  # just over the default cap, under Pillow's error
    with pytest.raises(Image.DecompressionBombError, match="max_pixels=67108864"):
        ImageBatch(8).check(big)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"formats": ()}, ValueError, "formats"),
        ({"formats": ("JPEG", "NOPE")}, ValueError, "formats.*NOPE"),
        ({"formats": ("JPEG", 3)}, TypeError, "formats"),
        ({"max_pixels": 0}, ValueError, "max_pixels"),
        ({"max_pixels": True}, TypeError, "max_pixels"),
        ({"max_pixels": 1.5}, TypeError, "max_pixels"),
    ],
)
def test_bad_formats_and_max_pixels_name_themselves(kwargs, error, match):
    with pytest.raises(error, match=match):
        ImageBatch(**kwargs)


def test_refused_images_are_skipped_with_check_as_transform():
    """check() opens only the header: as the loader's transform, with on_error="skip", a
    refused image is left out of its batch instead of failing it."""
    batch = ImageBatch(16, max_pixels=1000 * 1000 - 1)  # the photos are at most 500 x 375
    good = [(b, i) for i, (_, b, _) in enumerate(IMAGES[:6])]
    assert batch.check(good[0]) is good[0]
    samples = [*good[:2], (EPS, 90), *good[2:4], (png_declaring(1000, 1000), 91), *good[4:]]
    loader = AsyncLoader(
        samples, batch_size=4, transform=batch.check, collate_fn=batch, on_error="skip",
        max_skipped=2,
    )  # fmt: skip
    got = list(loader)
    assert sorted(i for _, labels in got for i in labels.tolist()) == list(range(6))
    assert loader.stats.skipped == 2
    assert [index for index, _ in loader.skip_log] == [2, 5]


# ---------------------------------------------------------------------------------------------
# The region decode (asyncloader._images.turbo): only the rows and iMCU columns of the crop.

needs_turbo = pytest.mark.skipif(
    turbo.library() is None, reason="needs the turbojpeg wheel (the images extra)"
)


def photo(width, height, seed=0):
    """RGB pixels like examples.image_data's: a smooth field with fine grain (every iMCU
    differs, and chroma changes from one pixel to the next)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC))
    grain = rng.integers(-26, 27, (height, width, 1), dtype=np.int16)
    return np.clip(field.astype(np.int16) + grain, 0, 255).astype(np.uint8)


def encoded(pixels, kind):
    """``pixels`` as a JPEG of one kind: a TurboJPEG subsampling (``Y411``...) by the wheel's
    own encoder, else Pillow's (``"4:2:0"``..., ``"progressive"``, ``"gray"``, ``"cmyk"``)."""
    if kind.startswith("Y"):
        import turbojpeg

        return turbojpeg.compress(pixels, 90, getattr(turbojpeg.SAMP, kind))
    image, options = Image.fromarray(pixels), {"quality": 90}
    if kind == "gray":
        image = image.convert("L")
    elif kind == "cmyk":
        image = image.convert("CMYK")
    elif kind == "progressive":
        options["progressive"] = True
    else:
        options["subsampling"] = kind
    out = io.BytesIO()
    image.save(out, "JPEG", **options)
    return out.getvalue()


def boxes(width, height, rng, n=25):
    """Random boxes, and boxes on every edge, at the corners, one pixel wide, and starting
    or ending on an iMCU boundary (8, 16, 32)."""
    edge = [
        (0, 0, width, height),
        (0, 0, 1, 1),
        (width - 1, height - 1, width, height),
        (width - 1, 0, width, 1),
        (0, height - 1, 1, height),
        (min(16, width - 1), 0, width, height),
        (0, min(8, height - 1), min(32, width), height),
        (min(15, width - 1), 3, min(17, width), min(40, height)),
    ]
    for _ in range(n):
        left, top = int(rng.integers(0, width)), int(rng.integers(0, height))
        right, bottom = (
            int(rng.integers(left + 1, width + 1)),
            int(rng.integers(top + 1, height + 1)),
        )
        edge.append((left, top, right, bottom))
    return edge


SIZES = [(466, 251), (33, 17), (250, 131), (17, 250), (64, 48), (129, 97)]
KINDS = ["4:4:4", "4:2:2", "4:2:0", "progressive", "gray", "Y411", "Y440", "Y441"]


@needs_turbo
@pytest.mark.parametrize("kind", KINDS)
def test_region_decode_equals_full_decode_then_crop(kind):
    """Over sizes that are not multiples of the iMCU and boxes on every edge: the region's
    pixels are exactly those of Pillow's full decode, cropped."""
    rng = np.random.default_rng(7)
    for width, height in SIZES:
        data = encoded(photo(width, height, seed=width), kind)
        header = turbo.read_header(data)
        assert header is not None and (header.width, header.height) == (width, height)
        full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        for left, top, right, bottom in boxes(width, height, rng):
            got = turbo.decode_box(data, header, (left, top, right, bottom))
            assert got is not None
            expected = full[top:bottom, left:right]
            assert got.shape == expected.shape
            assert np.array_equal(got, expected), (kind, width, height, (left, top, right, bottom))


def run_batch(samples, seed, **options):
    random.seed(seed)
    return ImageBatch(**{"output": "uint8", **options})(samples)


@needs_turbo
@pytest.mark.parametrize("kind", ["4:2:0", "4:4:4", "progressive", "gray", "cmyk"])
@pytest.mark.parametrize("options", [{"size": 56}, {"size": (40, 72), "crop": "center"}])
def test_imagebatch_decodes_regions_with_pillows_pixels_and_draws(kind, options):
    """ImageBatch with the region decode gives Pillow's path's batch (same random draws, so the
    same boxes and flips; the same pixels up to the resize's rounding); a CMYK JPEG, which the
    region decode leaves to Pillow, too."""
    samples = [encoded(photo(w, h, seed=w + h), kind) for w, h in [*SIZES, (320, 240)]]
    for seed in range(6):
        fast = run_batch(samples, seed, **options)
        slow = run_batch(samples, seed, decoder="pillow", **options)
        assert (fast.int() - slow.int()).abs().max() <= 1


@needs_turbo
def test_the_region_decode_is_used_and_pillow_only_where_needed(monkeypatch):
    """A JPEG is not opened by Pillow at all on the region path; a PNG, a CMYK JPEG, JPEGs
    when decoder="pillow" or when JPEG is not among the formats are."""
    opened = []
    real_open = ImageBatch._open
    monkeypatch.setattr(
        ImageBatch, "_open", lambda self, data: opened.append(1) or real_open(self, data)
    )
    ImageBatch(32)(as_dicts())
    assert opened == []
    ImageBatch(32, decoder="pillow")(as_dicts())
    assert len(opened) == len(IMAGES)
    opened.clear()
    cmyk = encoded(photo(40, 30), "cmyk")
    ImageBatch(32)([cmyk, image_bytes("PNG")])
    assert len(opened) == 2
    with pytest.raises(UnidentifiedImageError):
        ImageBatch(32, formats=("PNG",))([IMAGES[0][1]])


@pytest.fixture
def without_turbojpeg(monkeypatch):
    """As if the turbojpeg wheel were not installed (``import turbojpeg`` fails)."""
    monkeypatch.setitem(sys.modules, "turbojpeg", None)
    turbo.library.cache_clear()
    yield
    monkeypatch.undo()
    turbo.library.cache_clear()


def test_without_turbojpeg_imagebatch_decodes_with_pillow(without_turbojpeg, monkeypatch):
    assert turbo.library() is None
    assert turbo.read_header(IMAGES[0][1]) is None
    monkeypatch.setattr("asyncloader.images.decode_box", None)  # never called
    for seed in range(3):
        got = run_batch(as_dicts(), seed, size=48)
        expected = run_batch(as_dicts(), seed, size=48, decoder="pillow")
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@needs_turbo
def test_a_truncated_jpeg_raises_pillows_error_when_the_crop_reaches_the_damage():
    """The region decode returns nothing on libjpeg's warning; Pillow then decodes and raises
    as it did before. Rows above the damage decode (nothing below the box is read)."""
    data = IMAGES[0][1]
    cut = data[: len(data) // 2]
    header = turbo.read_header(cut)
    assert turbo.decode_box(cut, header, (0, 0, header.width, header.height)) is None
    assert turbo.decode_box(cut, header, (0, 0, header.width, 8)) is not None
    with pytest.raises(OSError, match="truncated"):
        ImageBatch(32, crop="center", center_fraction=1.0)([cut])


@needs_turbo
def test_the_region_decode_takes_any_contiguous_buffer_and_any_thread():
    data = IMAGES[1][1]
    header = turbo.read_header(data)
    box = (10, 20, 200, 150)
    expected = turbo.decode_box(data, header, box)
    for buffer in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert np.array_equal(turbo.decode_box(buffer, turbo.read_header(buffer), box), expected)
    assert turbo.read_header(b"\xff\xd8\xff") is None
    assert turbo.read_header(memoryview(data)[::2]) is None  # not contiguous
    with ThreadPoolExecutor(4) as pool:  # a handle per thread
        outs = list(
            pool.map(lambda _: turbo.decode_box(data, turbo.read_header(data), box), range(16))
        )
    assert all(np.array_equal(out, expected) for out in outs)

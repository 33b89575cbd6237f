"""A sample of an image batch split into its encoded image, label and key: bytes alone, an
``(image, label)`` pair, or a dict (a ``ShardedSource`` sample).

Imports: the standard library; nothing of asyncloader.
"""

from __future__ import annotations

from typing import Any


def split_sample(
    sample: Any, name: str, image_keys: tuple[str, ...], label_key: str | None
) -> tuple[Any, int | None, str | None]:
    """``(encoded image, label or None, key or None)`` of one sample (``name`` says which,
    in errors), its image under the first of ``image_keys`` a dict has."""
    if isinstance(sample, bytes | bytearray | memoryview):
        return sample, None, None
    if isinstance(sample, tuple | list) and len(sample) == 2:
        return sample[0], label_of(sample[1]), None
    if isinstance(sample, dict):
        for key in image_keys:
            if key in sample:
                label = None
                if label_key is not None and label_key in sample:
                    label = label_of(sample[label_key])
                return sample[key], label, sample.get("__key__")
        raise KeyError(
            f"ImageBatch: {name} has none of the image fields {image_keys} "
            f"(it has {sorted(sample)}); set image_key"
        )
    raise TypeError(
        f"ImageBatch: {name} is a {type(sample).__qualname__}; expected encoded image "
        "bytes, an (image, label) pair or a dict"
    )


def label_of(value: Any) -> int:
    """A label as an int: an int-like, or its text (``b"3"``)."""
    if isinstance(value, bytes | bytearray):
        return int(value.decode().strip())
    if isinstance(value, str):
        return int(value.strip())
    return int(value)

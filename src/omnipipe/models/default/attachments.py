"""Images attached to a written question, for the default family's text-only thinker.

The thinker is a text LLM with no vision encoder, so it reads an attached image as one line the stage measures
from the decoded pixels: its size and its main colour, e.g. ``[Attached image 1: 1280x720 pixels, mostly blue.]``.
That is all it can know of a picture; the Qwen-Omni families read images with their own encoders.

An image travels as its file's bytes (the raw input) and is *materialised* in the thinker stage: decoded into a
float32 [3, height, width] tensor in [0, 1] (what a vision encoder takes). In a tensor-parallel thinker every rank
needs it (each builds the same prompt from it), which is what ``stage/broadcast.py`` moves.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from omnipipe.util.data_url import parse_data_url, size_text
from omnipipe.util.field_error import FieldError

MAX_IMAGES = 4  # per question
MAX_IMAGE_BYTES = 20 * 1024 * 1024  # an encoded image file
MAX_PIXELS = 3840 * 2160  # a decoded image (4K): larger ones are refused, not resized
_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")

# nearest of these (by RGB distance to the mean colour) names an image's main colour
_COLOURS = {
    "black": (0, 0, 0), "white": (255, 255, 255), "grey": (128, 128, 128), "red": (200, 30, 30),
    "orange": (240, 140, 20), "yellow": (240, 220, 40), "green": (40, 160, 60), "teal": (20, 150, 150),
    "blue": (30, 70, 200), "purple": (120, 50, 160), "pink": (240, 130, 180), "brown": (120, 70, 30),
}


def encoded_image(value: Any, field: str) -> bytes:
    """An attached image as a file's bytes, checked (format, size) without decoding its pixels: a path, encoded
    bytes, a ``data:image/...;base64,`` URL, a PIL image or a uint8 array (H x W or H x W x 3/4)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, (str, Path)):
        text = str(value)
        if text.startswith("data:"):
            raw = parse_data_url(text, field=field, kind="image", max_bytes=MAX_IMAGE_BYTES)[1]
        else:
            path = Path(text)
            if not path.is_file():
                raise FieldError(field, f"file not found: {text}")
            if path.stat().st_size > MAX_IMAGE_BYTES:
                raise FieldError(field, f"is larger than {size_text(MAX_IMAGE_BYTES)}")
            raw = path.read_bytes()
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    elif isinstance(value, np.ndarray):
        raw = _png_of(value, field)
    elif isinstance(value, Image.Image):
        raw = _png_of(np.asarray(value.convert("RGB")), field)
    else:
        raise FieldError(field, f"expected a path, encoded bytes, a data URL, a PIL image or a uint8 array, got "
                         f"{type(value).__name__}")
    if not raw:
        raise FieldError(field, "the image is empty")
    if len(raw) > MAX_IMAGE_BYTES:
        raise FieldError(field, f"is larger than {size_text(MAX_IMAGE_BYTES)}")
    try:
        with Image.open(io.BytesIO(raw)) as image:
            kind, (width, height) = image.format, image.size
    except (UnidentifiedImageError, OSError, ValueError):
        raise FieldError(field, f"is not an image file this server reads ({', '.join(_FORMATS)})") from None
    if kind not in _FORMATS:
        raise FieldError(field, f"{kind} images are not taken (take {', '.join(_FORMATS)})")
    if width * height > MAX_PIXELS:
        raise FieldError(field, f"is {width}x{height} pixels, more than the {MAX_PIXELS:,} pixels taken")
    return raw


def _png_of(array: np.ndarray, field: str) -> bytes:
    from omnipipe.util.image import encode_image

    if array.dtype != np.uint8 or array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
        raise FieldError(field, f"an image array must be uint8 H x W or H x W x 3/4, got {array.dtype} "
                         f"{list(array.shape)}")
    if array.ndim == 3 and array.shape[2] == 4:
        array = array[:, :, :3]
    if array.shape[0] * array.shape[1] > MAX_PIXELS:
        raise FieldError(field, f"is {array.shape[1]}x{array.shape[0]} pixels, more than the {MAX_PIXELS:,} taken")
    return encode_image(np.ascontiguousarray(array))


def materialize(raw: dict[str, Any]) -> dict[str, Any]:
    """``{"images": [file bytes, ...]}`` -> ``{"images": [float32 tensor [3, H, W] in [0, 1], ...]}``."""
    import torch
    from PIL import Image

    images = []
    for data in raw["images"]:
        with Image.open(io.BytesIO(data)) as image:
            pixels = np.array(image.convert("RGB"))  # writable: torch shares its memory
        images.append(torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255.0))
    return {"images": images}


def describe(images: list[Any]) -> str:
    """One line per decoded image: its size and main colour."""
    lines = []
    for index, pixels in enumerate(images, start=1):
        _, height, width = pixels.shape
        mean = (pixels.mean(dim=(1, 2)) * 255.0).tolist()
        colour = min(_COLOURS, key=lambda name: sum((a - b) ** 2 for a, b in zip(mean, _COLOURS[name], strict=True)))
        lines.append(f"[Attached image {index}: {width}x{height} pixels, mostly {colour}.]")
    return "\n".join(lines)

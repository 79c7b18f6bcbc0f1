"""Images as the pipelines return them (uint8, height x width x channels, 1 or 3 channels): resized for showing
and encoded as PNG, WebP or JPEG with Pillow."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

FORMATS = ("png", "webp", "jpeg")
_SUFFIXES = {".png": "png", ".webp": "webp", ".jpg": "jpeg", ".jpeg": "jpeg"}


def format_for_path(path: Path) -> str | None:
    """The image format a file name asks for (by its suffix), or None."""
    return _SUFFIXES.get(path.suffix.lower())


def enlarge(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """``image`` scaled to ``width`` x ``height``: nearest-neighbour when both are whole multiples of its size
    (pixels stay crisp squares: an 8x8 digit at 256x256), else Pillow's Lanczos."""
    h, w = image.shape[:2]
    if (w, h) == (width, height):
        return image
    if width % w == 0 and height % h == 0:
        return np.repeat(np.repeat(image, height // h, axis=0), width // w, axis=1)
    from PIL import Image

    return _channels(np.asarray(_pil(image).resize((width, height), Image.Resampling.LANCZOS)))


def encode_image(image: np.ndarray, fmt: str = "png", quality: int | None = None) -> bytes:
    """``image`` as a file's bytes in ``fmt`` (png, webp or jpeg); ``quality`` 0-100 for webp and jpeg."""
    if fmt not in FORMATS:
        raise ValueError(f"image format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    buffer = io.BytesIO()
    options = {} if quality is None or fmt == "png" else {"quality": quality}
    _pil(image).save(buffer, format=fmt.upper(), **options)
    return buffer.getvalue()


def _pil(image: np.ndarray):  # noqa: ANN202 - PIL is imported lazily
    from PIL import Image

    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim not in (2, 3):
        raise ValueError(f"an image must be uint8 H x W (x C), got {array.dtype} {array.shape}")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    return Image.fromarray(array)


def _channels(array: np.ndarray) -> np.ndarray:
    return array[:, :, None] if array.ndim == 2 else array

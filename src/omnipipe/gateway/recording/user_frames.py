"""The camera frames of a live session (``input_video_frame.append``) as a recording keeps them: which frames it takes,
when each was shown on the session's timeline, and the JPEG it is saved as.

A frame is kept when the worker would take it: a base64 PNG or JPEG data URL of at most ``MAX_FRAME_BYTES`` whose
bytes are of that type, captured no sooner than ``MIN_FRAME_INTERVAL_MS`` after the previous kept frame (the clock
never going back). Capture times (``captured_at_ms``, on the client's clock) are mapped onto the session timeline by
one offset, fixed by the first kept frame: its arrival time at the gateway minus its capture time. The frames keep
the spacing they were captured with, whatever the network did to their arrival.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

from PIL import Image

from omnipipe.gateway.recording.file_checks import check_image
from omnipipe.gateway.recording.store import atomic_write_bytes
from omnipipe.protocol.realtime import MAX_FRAME_BYTES, MIN_FRAME_INTERVAL_MS
from omnipipe.util.data_url import parse_data_url
from omnipipe.util.field_error import FieldError

FRAMES_DIRNAME = "user_frames"
MAX_RECORDED_FRAMES = 14_400
"""An hour of frames at the highest rate; later frames of a session are not recorded."""
FRAME_MIMES = ("image/png", "image/jpeg")
JPEG_QUALITY = 90


def read_frame(image: Any) -> tuple[str, bytes]:
    """``(mime, bytes)`` of a frame's ``image`` data URL; ``FieldError`` naming ``image`` when the worker would
    refuse it (not a PNG or JPEG data URL, bad base64, too large, bytes not of the type it names)."""
    if not isinstance(image, str):
        raise FieldError("image", f"must be a data URL, got {type(image).__name__}")
    mime, data = parse_data_url(image, field="image", kind="image", max_bytes=MAX_FRAME_BYTES)
    mime = mime.lower()
    if mime not in FRAME_MIMES:
        raise FieldError("image", f"must be one of {', '.join(FRAME_MIMES)}, got {mime!r}")
    try:
        check_image(data, mime, MAX_FRAME_BYTES)
    except ValueError as exc:
        raise FieldError("image", str(exc).removeprefix("data: ")) from None
    return mime, data


class FrameTimeline:
    """Places kept frames on the session timeline (seconds since the session start) by their capture times."""

    def __init__(self) -> None:
        self._offset_s: float | None = None
        self._last_captured_ms: float | None = None

    def place(self, captured_at_ms: Any, arrived_at_s: float) -> float:
        """The session time of a frame captured at ``captured_at_ms`` that arrived ``arrived_at_s`` seconds into
        the session; ``FieldError`` naming ``captured_at_ms`` for a frame the worker refuses by its time."""
        if isinstance(captured_at_ms, bool) or not isinstance(captured_at_ms, (int, float)) \
                or not math.isfinite(captured_at_ms):
            raise FieldError("captured_at_ms", f"must be a finite number of milliseconds, got {captured_at_ms!r}")
        captured_at_ms = float(captured_at_ms)
        last = self._last_captured_ms
        if last is not None and captured_at_ms < last:
            raise FieldError("captured_at_ms", f"goes back: {captured_at_ms} is before the previous frame's {last}")
        if last is not None and captured_at_ms - last < MIN_FRAME_INTERVAL_MS:
            raise FieldError("captured_at_ms", f"frames are at most one per {MIN_FRAME_INTERVAL_MS:g} ms")
        if self._offset_s is None:
            self._offset_s = arrived_at_s - captured_at_ms / 1000.0
        self._last_captured_ms = captured_at_ms
        return round(max(0.0, captured_at_ms / 1000.0 + self._offset_s), 3)


def frame_path(number: int) -> str:
    """The relative path of a session's ``number``-th kept frame (from 1)."""
    return f"{FRAMES_DIRNAME}/{number:06d}.jpg"


def _as_jpeg(data: bytes, mime: str) -> bytes:
    if mime == "image/jpeg":
        return data
    with Image.open(io.BytesIO(data)) as image:
        rgb = image.convert("RGB")
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


def save_frame(path: Path, data: bytes, mime: str) -> str | None:
    """Write a frame as the JPEG ``path`` (a JPEG as it came, a PNG converted; atomically); ``None``, or why it was
    not written when a PNG does not decode."""
    try:
        jpeg = _as_jpeg(data, mime)
    except Exception as exc:  # noqa: BLE001 - a frame that does not decode is noted, never saved
        return str(exc)[:300]
    path.parent.mkdir(exist_ok=True)
    atomic_write_bytes(path, jpeg)
    return None


def frames_on_timeline(frames: list[dict[str, Any]], directory: Path) -> list[tuple[float, Path]]:
    """``(t, file)`` of a recording's ``frames`` entries whose JPEG was saved, in time order."""
    placed = [(float(entry["t"]), directory / entry["path"]) for entry in frames
              if isinstance(entry, dict) and isinstance(entry.get("path"), str) and "decode_error" not in entry]
    return sorted(((t, path) for t, path in placed if path.is_file()), key=lambda item: item[0])

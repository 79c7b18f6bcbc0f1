"""Media a caller attaches to a prompt (images, audio, video), in any form the API takes, decoded to arrays.

``load_image`` gives an RGB PIL image, ``load_audio`` float32 mono samples at a chosen rate, ``load_video`` uint8
``[T, H, W, 3]`` frames sampled at a chosen rate. Each takes the value as the caller gave it (an array, encoded
bytes, a ``data:<kind>/...;base64,`` URL or a local file path) and the ``field`` it came in; bad input raises
``FieldError(field, rule)``. Remote URLs are refused: nothing here fetches. Sizes are bounded before anything large
is decoded (the ``MAX_*`` limits below).
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from omnipipe.util.audio import AudioDecodeError, AudioTooLongError
from omnipipe.util.audio import load_audio as decode_audio
from omnipipe.util.data_url import parse_data_url, size_text
from omnipipe.util.field_error import FieldError

MAX_MEDIA_BYTES = 256 * 1024 * 1024  # one encoded image, audio or video file
MAX_IMAGE_PIXELS = 4096 * 4096  # one decoded image or video frame
MAX_AUDIO_SECONDS = 1200.0
MAX_VIDEO_SECONDS = 1200.0
MAX_VIDEO_DECODED_FRAMES = 36_000  # frames a video file may hold (20 minutes at 30 fps)
MAX_FPS = 120.0  # the highest sampling rate load_video takes
MAX_VIDEO_FRAMES = 1024  # the highest max_frames load_video takes


# ---------------------------------------------------------------------------------------------- encoded inputs
def _encoded(value: Any, kind: str, field: str) -> bytes | None:
    """The file's bytes of an encoded input (bytes, a data URL, a local path), checked for size; None when
    ``value`` is none of these."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    elif isinstance(value, str) and value.startswith("data:"):
        raw = parse_data_url(value, field=field, kind=kind, max_bytes=MAX_MEDIA_BYTES)[1]
    elif isinstance(value, str) and value.split(":", 1)[0].lower() in ("http", "https", "ftp", "s3", "gs"):
        raise FieldError(field, f"remote URLs are not fetched: give the {kind} inline (bytes or a data URL)")
    elif isinstance(value, (str, Path)):
        path = Path(value).expanduser()
        if not path.is_file():
            raise FieldError(field, f"file not found: {value}")
        if path.stat().st_size > MAX_MEDIA_BYTES:
            raise FieldError(field, f"is larger than {size_text(MAX_MEDIA_BYTES)}")
        raw = path.read_bytes()
    else:
        return None
    if not raw:
        raise FieldError(field, f"the {kind} is empty")
    if len(raw) > MAX_MEDIA_BYTES:
        raise FieldError(field, f"is larger than {size_text(MAX_MEDIA_BYTES)}")
    return raw


def encoded_file(value: Any, kind: str, field: str) -> bytes | None:
    """The file's bytes when ``value`` is an encoded input (bytes, a ``data:<kind>/...;base64,`` URL or a local
    path), checked for size; None when it is anything else (an array, a list of frames). For a caller that decodes
    later, e.g. a stage that samples a video file at its own rate."""
    return _encoded(value, kind, field)


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else type(exc).__name__


# ---------------------------------------------------------------------------------------------- images
def _check_pixels(width: int, height: int, field: str) -> None:
    if width <= 0 or height <= 0:
        raise FieldError(field, f"the image is empty ({width}x{height} pixels)")
    if width * height > MAX_IMAGE_PIXELS:
        raise FieldError(field, f"is {width}x{height} pixels, more than the {MAX_IMAGE_PIXELS:,} taken")


def _image_from_array(array: np.ndarray, field: str) -> Any:
    from PIL import Image

    if array.dtype != np.uint8:
        raise FieldError(field, f"an image array must be uint8, got {array.dtype}")
    if array.ndim == 3 and array.shape[2] in (1, 3, 4):
        pass
    elif array.ndim != 2:
        raise FieldError(field, f"an image array must be H x W or H x W x 3, got shape {list(array.shape)}")
    _check_pixels(array.shape[1], array.shape[0], field)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    return Image.fromarray(np.ascontiguousarray(array)).convert("RGB")


def load_image(value: Any, field: str) -> Any:
    """``value`` as an RGB ``PIL.Image.Image``: a PIL image, a uint8 H x W or H x W x 3 array, encoded bytes (PNG,
    JPEG, WebP, GIF, BMP, ...: whatever Pillow reads; an animation gives its first frame), a
    ``data:image/...;base64,`` URL or a local file path."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        _check_pixels(*value.size, field)
        return value.convert("RGB")
    if isinstance(value, np.ndarray):
        return _image_from_array(value, field)
    raw = _encoded(value, "image", field)
    if raw is None:
        raise FieldError(field, "expected a PIL image, a uint8 array, encoded bytes, a data:image URL or a file "
                         f"path, got {type(value).__name__}")
    try:
        with Image.open(io.BytesIO(raw)) as image:
            _check_pixels(*image.size, field)  # from the header, before the pixels are decoded
            return image.convert("RGB")
    except FieldError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise FieldError(field, f"is not an image Pillow can decode ({_one_line(exc)})") from None


# ---------------------------------------------------------------------------------------------- audio
def _positive_rate(rate: Any, name: str) -> int:
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise FieldError(name, f"a sample rate must be a positive integer, got {rate!r}")
    return int(rate)


def load_audio(value: Any, field: str, sample_rate: int = 16000) -> np.ndarray:
    """``value`` as float32 mono samples at ``sample_rate``: a float array already at ``sample_rate``, a tuple
    ``(array, rate)`` (resampled), encoded bytes (WAV, FLAC, OGG, MP3 through libsndfile; other containers through
    FFmpeg), a ``data:audio/...;base64,`` URL or a local file path. Integer arrays are scaled to [-1, 1]; 2-D
    arrays are [frames, channels] and averaged. Resampling is soxr's (``util/audio.resample``)."""
    sample_rate = _positive_rate(sample_rate, "sample_rate")
    try:
        if isinstance(value, tuple):
            if len(value) != 2:
                raise FieldError(field, f"give (samples, sample_rate_hz), got a tuple of {len(value)}")
            samples, rate = value
            rate = _positive_rate(rate, field)
            if not isinstance(samples, np.ndarray):
                raise FieldError(field, f"the samples of (samples, rate) must be a numpy array, got "
                                 f"{type(samples).__name__}")
            audio, _ = decode_audio(samples, sample_rate, source_rate_hz=rate, max_seconds=MAX_AUDIO_SECONDS)
        elif isinstance(value, np.ndarray):
            audio, _ = decode_audio(value, sample_rate, source_rate_hz=sample_rate, max_seconds=MAX_AUDIO_SECONDS)
        else:
            raw = _encoded(value, "audio", field)
            if raw is None:
                raise FieldError(field, "expected a float array, (samples, rate), encoded bytes, a data:audio URL "
                                 f"or a file path, got {type(value).__name__}")
            audio, _ = decode_audio(raw, sample_rate, max_seconds=MAX_AUDIO_SECONDS)
    except AudioTooLongError:
        raise FieldError(field, f"is longer than {MAX_AUDIO_SECONDS:g} s") from None
    except AudioDecodeError as exc:
        raise FieldError(field, f"is not audio this server can decode ({_one_line(exc)})") from None
    except TypeError as exc:
        raise FieldError(field, _one_line(exc)) from None
    if audio.size == 0:
        raise FieldError(field, "the audio is empty")
    return audio


# ---------------------------------------------------------------------------------------------- video
def _check_sampling(fps: Any, max_frames: Any) -> tuple[float, int]:
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= MAX_FPS or math.isnan(fps):
        raise FieldError("fps", f"must be a number in (0, {MAX_FPS:g}], got {fps!r}")
    if isinstance(max_frames, bool) or not isinstance(max_frames, int) or not 1 <= max_frames <= MAX_VIDEO_FRAMES:
        raise FieldError("max_frames", f"must be an integer in [1, {MAX_VIDEO_FRAMES}], got {max_frames!r}")
    return float(fps), max_frames


def spread(count: int, max_frames: int) -> list[int]:
    """``max_frames`` indices spread evenly over ``range(count)`` (the first and the last included), or all of
    them when there are no more than ``max_frames``."""
    if count <= max_frames:
        return list(range(count))
    if max_frames == 1:
        return [0]
    return [round(i * (count - 1) / (max_frames - 1)) for i in range(max_frames)]


def nearest_frames(times: list[float], fps: float) -> list[int]:
    """For each instant ``0, 1/fps, 2/fps, ...`` up to the last frame's time (times are seconds from the first
    frame, ascending), the index of the frame nearest to it (the earlier one on a tie)."""
    if not times:
        return []
    chosen: list[int] = []
    k = 0
    step = 0
    while True:
        instant = step / fps
        if instant > times[-1] + 1e-9:
            return chosen
        while k + 1 < len(times) and abs(times[k + 1] - instant) < abs(times[k] - instant):
            k += 1
        chosen.append(k)
        step += 1


def _frames_of_list(value: list[Any] | tuple[Any, ...], field: str, max_frames: int) -> np.ndarray:
    """The frames kept (``max_frames`` spread evenly), each decoded; the others are not looked at."""
    if not value:
        raise FieldError(field, "the video has no frames")
    kept = spread(len(value), max_frames)
    frames = [np.asarray(load_image(value[i], f"{field}[{i}]")) for i in kept]
    for i, frame in zip(kept, frames, strict=True):
        if frame.shape != frames[0].shape:
            raise FieldError(f"{field}[{i}]", f"is {frame.shape[1]}x{frame.shape[0]} pixels; every frame must be "
                             f"the size of the first ({frames[0].shape[1]}x{frames[0].shape[0]})")
    return np.stack(frames)


def _frames_of_array(array: np.ndarray, field: str) -> np.ndarray:
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[3] != 3:
        raise FieldError(field, f"a video array must be uint8 [T, H, W, 3], got {array.dtype} {list(array.shape)}")
    if array.shape[0] == 0:
        raise FieldError(field, "the video has no frames")
    _check_pixels(array.shape[2], array.shape[1], field)
    return array


def _open_video(raw: bytes, field: str) -> tuple[Any, Any]:
    import av

    try:
        container = av.open(io.BytesIO(raw), mode="r")
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise FieldError(field, f"is not a video this server can decode ({_one_line(exc)})") from None
    if not container.streams.video:
        container.close()
        raise FieldError(field, "has no video stream")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    return container, stream


def _presentation_times(raw: bytes, field: str) -> list[float]:
    """Seconds from the first frame of each frame of the video, in presentation order, read from the packets'
    timestamps (nothing is decoded); frame count over the stream's rate when the packets carry none."""
    import av

    container, stream = _open_video(raw, field)
    with container:
        width, height = stream.codec_context.width, stream.codec_context.height
        if width and height:
            _check_pixels(width, height, field)
        stamps: list[int | None] = []
        try:
            for packet in container.demux(stream):
                if packet.size == 0:  # the demuxer's closing empty packet
                    continue
                stamps.append(packet.pts)
                if len(stamps) > MAX_VIDEO_DECODED_FRAMES:
                    raise FieldError(field, f"has more than {MAX_VIDEO_DECODED_FRAMES} frames")
        except av.FFmpegError as exc:
            raise FieldError(field, f"is not a video this server can decode ({_one_line(exc)})") from None
        if not stamps:
            raise FieldError(field, "the video has no frames")
        if all(s is not None for s in stamps) and stream.time_base:
            ordered = sorted(stamps)  # type: ignore[type-var]
            times = [float((s - ordered[0]) * stream.time_base) for s in ordered]  # type: ignore[operator]
        else:
            rate = stream.average_rate or stream.guessed_rate
            if not rate:
                raise FieldError(field, "the video has neither timestamps nor a frame rate")
            times = [k / float(rate) for k in range(len(stamps))]
    if times[-1] > MAX_VIDEO_SECONDS:
        raise FieldError(field, f"is longer than {MAX_VIDEO_SECONDS:g} s")
    return times


def _decode_frames(raw: bytes, wanted: list[int], field: str) -> dict[int, np.ndarray]:
    """The frames at the presentation-order indices in ``wanted``, as uint8 RGB arrays."""
    import av

    needed = set(wanted)
    frames: dict[int, np.ndarray] = {}
    container, stream = _open_video(raw, field)
    with container:
        try:
            for k, frame in enumerate(container.decode(stream)):
                if k in needed:
                    _check_pixels(frame.width, frame.height, field)
                    frames[k] = frame.to_ndarray(format="rgb24")
                    if len(frames) == len(needed):
                        break
        except av.FFmpegError as exc:
            raise FieldError(field, f"is not a video this server can decode ({_one_line(exc)})") from None
    if not frames:
        raise FieldError(field, "no frame of the video could be decoded")
    if len(frames) < len(needed):
        raise FieldError(field, f"only {len(frames)} of the {len(needed)} frames sampled could be decoded "
                         "(a damaged file?)")
    return frames


def _frames_of_file(raw: bytes, field: str, fps: float, max_frames: int) -> np.ndarray:
    times = _presentation_times(raw, field)
    chosen = nearest_frames(times, fps)
    chosen = [chosen[i] for i in spread(len(chosen), max_frames)]
    frames = _decode_frames(raw, chosen, field)
    shapes = {frames[k].shape for k in chosen}
    if len(shapes) > 1:
        raise FieldError(field, "the video changes size between the frames sampled")
    return np.stack([frames[k] for k in chosen])


def load_video(value: Any, field: str, fps: float = 2.0, max_frames: int = 64) -> np.ndarray:
    """``value`` as uint8 ``[T, H, W, 3]`` frames. A video file (encoded bytes, a ``data:video/...;base64,`` URL or
    a local path; any container and codec FFmpeg reads) is sampled at ``fps``: for each instant ``0, 1/fps,
    2/fps, ...`` up to the last frame, the frame nearest to it. A list of images (each anything ``load_image``
    takes) or a ``[T, H, W, 3]`` uint8 array is taken as the frames already sampled. More than ``max_frames``
    frames are cut to ``max_frames`` spread evenly (the first and the last kept; of a list, only those are
    decoded)."""
    fps, max_frames = _check_sampling(fps, max_frames)
    if isinstance(value, (list, tuple)):
        return _frames_of_list(value, field, max_frames)
    if isinstance(value, np.ndarray):
        frames = _frames_of_array(value, field)
    else:
        raw = _encoded(value, "video", field)
        if raw is None:
            raise FieldError(field, "expected a list of images, a uint8 [T, H, W, 3] array, encoded bytes, a "
                             f"data:video URL or a file path, got {type(value).__name__}")
        return _frames_of_file(raw, field, fps, max_frames)
    return np.ascontiguousarray(frames[spread(len(frames), max_frames)])

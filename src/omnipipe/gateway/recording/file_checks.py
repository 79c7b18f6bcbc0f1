"""The files a recording keeps as sent: the image, video and audio types it takes, their extensions, and the check
that bytes are what their type says (by their first bytes), so a recorded file is never served as something else."""

from __future__ import annotations

from collections.abc import Callable

IMAGE_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}
_IMAGE_SIGNATURES: dict[str, Callable[[bytes], bool]] = {
    "image/png": lambda data: data.startswith(b"\x89PNG\r\n\x1a\n"),
    "image/jpeg": lambda data: data.startswith(b"\xff\xd8\xff"),
    "image/gif": lambda data: data[:6] in (b"GIF87a", b"GIF89a"),
    "image/webp": lambda data: data[:4] == b"RIFF" and data[8:12] == b"WEBP",
}
VIDEO_EXTENSIONS = {"video/mp4": "mp4", "video/quicktime": "mov", "video/webm": "webm", "video/x-matroska": "mkv",
                    "video/ogg": "ogv"}
_VIDEO_SIGNATURES: dict[str, Callable[[bytes], bool]] = {
    "video/mp4": lambda data: data[4:8] == b"ftyp",
    "video/quicktime": lambda data: data[4:8] in (b"ftyp", b"moov", b"mdat", b"wide", b"free"),
    "video/webm": lambda data: data.startswith(b"\x1a\x45\xdf\xa3"),
    "video/x-matroska": lambda data: data.startswith(b"\x1a\x45\xdf\xa3"),
    "video/ogg": lambda data: data.startswith(b"OggS"),
}


def _check_file(data: bytes, mime: str, max_bytes: int, kind: str,
                signatures: dict[str, Callable[[bytes], bool]]) -> None:
    """``ValueError`` for an empty or oversized ``kind`` (image, video), or bytes that are not of type ``mime``."""
    if not data:
        raise ValueError(f"data: the {kind} is empty")
    if len(data) > max_bytes:
        raise ValueError(f"data: the {kind} has {len(data)} bytes, more than the limit of {max_bytes}")
    if not signatures[mime](data):
        raise ValueError(f"data: the bytes are not a {mime} {kind}")


def check_image(data: bytes, mime: str, max_image_bytes: int) -> None:
    _check_file(data, mime, max_image_bytes, "image", _IMAGE_SIGNATURES)


def png_size(data: bytes) -> dict[str, int]:
    """``{"width", "height"}`` read from a PNG's first chunk (``IHDR``, big-endian), or ``{}`` if it has none."""
    if data[12:16] != b"IHDR" or len(data) < 24:
        return {}
    return {"width": int.from_bytes(data[16:20], "big"), "height": int.from_bytes(data[20:24], "big")}


def check_video(data: bytes, mime: str, max_video_bytes: int) -> None:
    _check_file(data, mime, max_video_bytes, "video", _VIDEO_SIGNATURES)


AUDIO_FILE_EXTENSIONS = frozenset({"wav", "mp3", "flac", "ogg", "oga", "opus", "m4a", "mp4", "aac", "webm", "weba",
                                   "aif", "aiff", "amr", "3gp", "wma", "caf", "mka"})
"""Extensions audio kept as sent may have; any other becomes ``bin``, so the gateway never serves a recorded
file under a type a browser would run (``.html``, ``.svg``, ...)."""


def audio_extension(value: str) -> str:
    """``value`` (``.MP3``, ``wav``) as a kept audio file's extension: ``bin`` unless in ``AUDIO_FILE_EXTENSIONS``."""
    extension = value.lower().lstrip(".")
    return extension if extension in AUDIO_FILE_EXTENSIONS else "bin"

"""Qwen3-Omni's prompt processor (the thinker -> talker hand-off is ``handoff.py``).

The prompt processor loads the caller's media once, in the engine: images to uint8 arrays, audio to 16 kHz float
arrays, videos given as frames to a uint8 [T, H, W, 3] array, and video files to their bytes (the thinker samples
them at its ``video_fps``). Audio streamed in beforehand (``AsyncOmni.append_audio``) is named as
``[{"stream": id}]`` and passes to the thinker as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnipipe.config.pipeline_spec import EntryInput
from omnipipe.stage.streaming_audio import checked_stream_audio
from omnipipe.util.field_error import FieldError

MAX_ITEMS = 8  # media items of one kind in a prompt


def _as_list(value: Any, field: str) -> list[Any]:
    """One item or a list of them (a tuple is one item: audio as ``(samples, sample_rate)``)."""
    items = value if isinstance(value, list) else [value]
    if not 1 <= len(items) <= MAX_ITEMS:
        raise FieldError(field, f"give 1 to {MAX_ITEMS} items, got {len(items)}")
    return items


def _video(value: Any, field: str) -> Any:
    """A video file stays encoded (bytes) for the thinker to sample; frames are loaded now."""
    from omnipipe.util.media import load_video

    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, Path) or (isinstance(value, str) and not value.startswith("data:")):
        path = Path(value).expanduser()
        if not path.is_file():
            raise FieldError(field, f"no such video file: {str(path)!r}")
        return path.read_bytes()
    if isinstance(value, str):
        return value  # a data: URL, decoded by the thinker
    return load_video(value, field)


def prompt(prompt: dict[str, Any]) -> EntryInput:
    mm = prompt.get("multi_modal_data") or {}
    where = "prompt.multi_modal_data"
    item: dict[str, Any] = {"text": prompt.get("prompt", ""), "history": prompt.get("history", []),
                            "tools": prompt.get("tools", [])}
    if mm:
        import numpy as np

        from omnipipe.util.media import load_audio, load_image
    if "image" in mm:
        images = _as_list(mm["image"], f"{where}.image")
        item["images"] = [np.asarray(load_image(v, f"{where}.image[{i}]").convert("RGB"), dtype=np.uint8)
                          for i, v in enumerate(images)]
    if "audio" in mm:
        audios = _as_list(mm["audio"], f"{where}.audio")
        item["audios"] = (checked_stream_audio(audios, f"{where}.audio")
                          or [load_audio(v, f"{where}.audio[{i}]") for i, v in enumerate(audios)])
    if "video" in mm:
        videos = mm["video"]
        # one video given as a list of frames, or several videos
        if isinstance(videos, list) and videos and not isinstance(videos[0], (list, bytes, str, Path)) \
                and not (hasattr(videos[0], "ndim") and videos[0].ndim == 4):
            videos = [videos]
        videos = _as_list(videos, f"{where}.video")
        item["videos"] = [_video(v, f"{where}.video[{i}]") for i, v in enumerate(videos)]
    return EntryInput("thinker", item)

"""Stage handoff for Qwen2.5-Omni: the prompt processor (prompt -> the thinker's chat and media), the talker ->
token2wav edge (codec frames with context), and the knobs the stages read from ``SamplingParams.extra``. The
thinker -> talker edge (the hidden states the talker reads) is ``handoff.py``.

The checkpoint's processor (tokenizer, image processor, feature extractor) runs inside the thinker stage, which
knows the checkpoint; the prompt processor only decodes media into arrays, but for video files, which stay encoded
(bytes) for the thinker to sample at its ``video_fps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from omnipipe.chunk.accumulation import FrameChunkOptions
from omnipipe.chunk.context import ChunkContext
from omnipipe.chunk.frame_processors import frames_async_chunk, frames_whole
from omnipipe.config.pipeline_spec import EntryInput
from omnipipe.stage.streaming_audio import checked_stream_audio
from omnipipe.util.field_error import FieldError
from omnipipe.util.media import MAX_VIDEO_FRAMES, encoded_file, load_audio, load_image, load_video

DEFAULT_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving auditory and "
    "visual inputs, as well as generating text and speech."
)
AUDIO_RATE_HZ = 16_000
MAX_ITEMS = 8  # media items of one kind in a prompt
DEFAULT_SPEAKER = "Chelsie"  # the voice of a request that names none, unless the talker's ``speaker`` option says


@dataclass(frozen=True)
class Qwen25TalkerParams:
    """The talker's ``SamplingParams.extra``: ``speaker`` is the voice (a name in the checkpoint's spk_dict.pt, any
    case; None: the talker stage's ``speaker`` option)."""

    speaker: str | None = None

    def __post_init__(self) -> None:
        if self.speaker is not None and (not isinstance(self.speaker, str) or not self.speaker):
            raise FieldError("speaker", f"must be a voice name, got {self.speaker!r}")


MAX_REFERENCE_FRAMES = 3_000  # 30 s of mel at 100 frames per second


@dataclass(frozen=True)
class Qwen25Token2WavParams:
    """The token2wav's ``SamplingParams.extra``: ``reference_mel``, a reference mel spectrogram (rows of mel bands,
    ``reference_voice.py``) that replaces the voice's own ``ref_mel`` (its x-vector stays the voice's); None: the
    voice's own."""

    reference_mel: list[list[float]] | None = None

    def __post_init__(self) -> None:
        mel = self.reference_mel
        if mel is None:
            return
        if not isinstance(mel, list) or not 1 <= len(mel) <= MAX_REFERENCE_FRAMES:
            raise FieldError("reference_mel", f"must be a list of 1 to {MAX_REFERENCE_FRAMES} mel frames")
        try:
            values = np.asarray(mel)
        except ValueError:  # rows of different lengths
            values = np.zeros(0)
        if values.ndim != 2 or values.shape[1] == 0 or values.dtype.kind not in "if" or not np.isfinite(values).all():
            raise FieldError("reference_mel", "every frame must be a list of as many finite numbers as the first")


def _items(mm: dict[str, Any], key: str) -> list[Any]:
    """The items of one modality: a single value or a list of them (for ``video``, a list of frames is one
    video)."""
    value = mm.get(key)
    if value is None:
        return []
    one_item = not isinstance(value, list) or (key == "video" and value and _is_frame(value[0]))
    values = [value] if one_item else value
    if len(values) > MAX_ITEMS:
        raise FieldError(f"prompt.multi_modal_data.{key}", f"give at most {MAX_ITEMS}, got {len(values)}")
    return values


def _is_frame(value: Any) -> bool:
    from PIL import Image

    return isinstance(value, Image.Image) or (isinstance(value, np.ndarray) and value.ndim in (2, 3))


def _video(value: Any, field: str) -> Any:
    """A video file's bytes (the thinker samples it), or frames as a [T, H, W, 3] uint8 array (the thinker keeps
    at most its ``video_max_frames`` of them)."""
    raw = encoded_file(value, "video", field)
    if raw is not None:
        return raw
    return np.asarray(load_video(value, field, max_frames=MAX_VIDEO_FRAMES))


def omni_prompt(prompt: dict[str, Any]) -> EntryInput:
    """A prompt -> the thinker's chat (history, then the user turn: media first, then the text) and its media:
    images as HxWx3 uint8, audio as float32 mono at 16 kHz, videos given as frames as [T, H, W, 3] uint8 and video
    files as their bytes (``video_fields`` names each video's field for the thinker's errors)."""
    mm = prompt.get("multi_modal_data") or {}
    field = "prompt.multi_modal_data"

    def named(key: str, i: int, count: int) -> str:
        return f"{field}.{key}[{i}]" if count > 1 or isinstance(mm.get(key), list) else f"{field}.{key}"

    images = _items(mm, "image")
    audios = _items(mm, "audio")
    videos = _items(mm, "video")
    # [{"stream": id}]: to the thinker as it is
    streamed: list[Any] | None = checked_stream_audio(audios, f"{field}.audio")
    data = {
        "text": prompt.get("prompt", ""),
        "history": list(prompt.get("history") or []),
        "images": [np.asarray(load_image(v, named("image", i, len(images)))) for i, v in enumerate(images)],
        "audios": streamed or [np.asarray(load_audio(v, named("audio", i, len(audios)), AUDIO_RATE_HZ),
                                          dtype=np.float32) for i, v in enumerate(audios)],
        "videos": [_video(v, named("video", i, len(videos))) for i, v in enumerate(videos)],
        "video_fields": [named("video", i, len(videos)) for i in range(len(videos))],
    }
    for i, audio in enumerate([] if streamed else data["audios"]):
        if audio.size == 0:
            raise FieldError(named("audio", i, len(audios)), "the audio is empty")
    return EntryInput("thinker", data)


def chat_messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The thinker input's conversation in the processor's chat format (the family's system prompt unless the
    history starts with one)."""
    history = list(data.get("history") or [])
    messages: list[dict[str, Any]] = []
    if not history or history[0]["role"] != "system":
        messages.append({"role": "system", "content": [{"type": "text", "text": DEFAULT_SYSTEM_PROMPT}]})
    for turn in history:
        messages.append({"role": turn["role"], "content": [{"type": "text", "text": turn["content"]}]})
    content = ([{"type": "image"} for _ in data.get("images", [])] + [{"type": "audio"} for _ in data.get("audios", [])]
               + [{"type": "video"} for _ in data.get("videos", [])])
    if data.get("text"):
        content.append({"type": "text", "text": data["text"]})
    messages.append({"role": "user", "content": content})
    return messages


# ---------------------------------------------------------------- talker -> token2wav
# The talker's step data: {"frames": [1, 1] int64 codec code, "speaker": name}; the vocoder needs the voice too.


def _with_speaker(chunks: list[dict[str, Any]], speaker: str | None) -> list[dict[str, Any]]:
    for chunk in chunks:
        chunk["speaker"] = speaker
    return chunks


def talker2token2wav(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every code of the request in one window, with the voice."""
    speaker = next((o["speaker"] for o in outputs if "speaker" in o), None)
    return _with_speaker(frames_whole(outputs), speaker)


def talker2token2wav_async_chunk(state: dict[str, Any], output: dict[str, Any], is_last: bool,
                                 ctx: ChunkContext) -> list[dict[str, Any]]:
    """Codes accumulated to ``codec_chunk_frames`` (a smaller first chunk), each window with left and right context
    codes (``FrameChunkOptions``), with the voice."""
    if "speaker" in output:
        state["speaker"] = output["speaker"]
    if not isinstance(ctx.options, FrameChunkOptions):
        raise TypeError("the talker->token2wav edge takes FrameChunkOptions")
    return _with_speaker(frames_async_chunk(state, output, is_last, ctx), state.get("speaker"))

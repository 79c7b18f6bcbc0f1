"""The stage options of the Qwen3-Omni stages (deploy ``stages.<name>.options``) beyond what every checkpoint stage
takes (``stage/checkpoint_options.py``: model, dtype, gpu_memory_fraction, torch_compile)."""

from __future__ import annotations

from dataclasses import dataclass

from omnipipe.stage.checkpoint_options import CheckpointOptions, DecoderCheckpointOptions
from omnipipe.util.field_error import FieldError


def _positive_int(name: str, value: object, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise FieldError(name, f"must be an integer in [1, {most}], got {value!r}")


@dataclass(frozen=True)
class ThinkerOptions(DecoderCheckpointOptions):
    """``max_new_tokens``: a request's cap when it gives no SamplingParams; ``video_fps``: frames per second sampled
    from a video file (and the rate frames given as frames are taken to have); ``video_max_frames``: at most that
    many frames of one video."""

    max_new_tokens: int = 1024
    video_fps: float = 2.0
    video_max_frames: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("max_new_tokens", self.max_new_tokens, 1 << 20)
        _positive_int("video_max_frames", self.video_max_frames, 1024)
        fps = self.video_fps
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= 120:
            raise FieldError("video_fps", f"must be a number in (0, 120], got {fps!r}")


@dataclass(frozen=True)
class TalkerOptions(DecoderCheckpointOptions):
    """``speaker``: the voice (default: Ethan where the checkpoint has him, else its first); ``max_new_tokens``: a
    request's cap in codec frames (12.5 per second) when it gives no talker SamplingParams."""

    speaker: str | None = None
    max_new_tokens: int = 4096

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.speaker is not None and (not isinstance(self.speaker, str) or not self.speaker):
            raise FieldError("speaker", f"must be a voice name, got {self.speaker!r}")
        _positive_int("max_new_tokens", self.max_new_tokens, 1 << 20)


@dataclass(frozen=True)
class Code2WavOptions(CheckpointOptions):
    """Only what every checkpoint stage takes."""

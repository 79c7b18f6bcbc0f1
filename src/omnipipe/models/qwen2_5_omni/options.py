"""The stage options of the Qwen2.5-Omni stages (deploy ``stages.<name>.options``) beyond what every checkpoint
stage takes (``stage/checkpoint_options.py``: model, dtype, gpu_memory_fraction, torch_compile)."""

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
    from a video file given as bytes, a path or a data URL (and the rate frames given as frames are taken to have;
    it sets the videos' time positions); ``video_max_frames``: at most that many frames of a video, spread evenly,
    the first and last kept."""

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
    """``max_codes``: a request's cap in codec codes (50 per second) when it gives no talker SamplingParams."""

    max_codes: int = 2048

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("max_codes", self.max_codes, 1 << 20)


@dataclass(frozen=True)
class Token2WavOptions(CheckpointOptions):
    """``dtype`` defaults to float32 here (the DiT's ODE steps and BigVGAN are kept in full precision);
    ``vocoder_left_mel``: mel frames of left context BigVGAN reads before a window (48)."""

    dtype: str = "float32"
    vocoder_left_mel: int = 48

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("vocoder_left_mel", self.vocoder_left_mel, 4096)

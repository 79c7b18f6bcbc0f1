"""The stage options of the Qwen3-Omni stages (deploy ``stages.<name>.options``), checked when a stage loads:
unknown keys are refused, every error names its key."""

from __future__ import annotations

from dataclasses import dataclass

from omnipipe.util.field_error import FieldError

DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")


def _positive_int(name: str, value: object, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise FieldError(name, f"must be an integer in [1, {most}], got {value!r}")


@dataclass(frozen=True)
class PartOptions:
    """What every stage takes: ``model`` (the checkpoint directory; ``--model DIR`` sets it on every stage),
    ``dtype`` (auto: bfloat16 on CUDA, float32 elsewhere), ``gpu_memory_fraction`` (0 < f <= 1 of its CUDA
    device's memory, for stages sharing a GPU; CUDA only)."""

    model: str = ""
    dtype: str = "auto"
    gpu_memory_fraction: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise FieldError("model", "must name a Qwen3-Omni checkpoint directory (config.json + *.safetensors); "
                             "`omnipipe tiny-checkpoint qwen3_omni DIR` writes a tiny one")
        if self.dtype not in DTYPE_NAMES:
            raise FieldError("dtype", f"must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        value = self.gpu_memory_fraction
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1):
            raise FieldError("gpu_memory_fraction", f"must be a number in (0, 1], got {value!r}")


@dataclass(frozen=True)
class DecoderOptions(PartOptions):
    """A stage with a text decoder: ``torch_compile`` compiles its forward (dynamic shapes; off by default: on a
    CPU the compile costs more than it saves at these step sizes)."""

    torch_compile: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.torch_compile, bool):
            raise FieldError("torch_compile", f"must be true or false, got {self.torch_compile!r}")


@dataclass(frozen=True)
class ThinkerOptions(DecoderOptions):
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
class TalkerOptions(DecoderOptions):
    """``speaker``: the voice (default: the first the checkpoint lists); ``max_new_tokens``: a request's cap in codec
    frames (12.5 per second) when it gives no talker SamplingParams."""

    speaker: str | None = None
    max_new_tokens: int = 4096

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.speaker is not None and (not isinstance(self.speaker, str) or not self.speaker):
            raise FieldError("speaker", f"must be a voice name, got {self.speaker!r}")
        _positive_int("max_new_tokens", self.max_new_tokens, 1 << 20)


@dataclass(frozen=True)
class Code2WavOptions(PartOptions):
    """Only what every stage takes."""

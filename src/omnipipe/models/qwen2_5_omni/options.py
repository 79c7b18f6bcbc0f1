"""The stage options of the Qwen2.5-Omni talker and vocoder (deploy ``stages.<name>.options``) beyond what every
checkpoint stage takes (``stage/checkpoint_options.py``: model, dtype, gpu_memory_fraction, step_per_request; the
talker, a batched decoder, also its KV cache's budget and blocks, prefill_chunk_tokens and torch_compile); the
thinker takes exactly a multimodal thinker's (``MultimodalThinkerOptions`` there)."""

from __future__ import annotations

from dataclasses import dataclass

from omnipipe.stage.checkpoint_options import (
    CheckpointOptions,
    DecoderCheckpointOptions,
    positive_int,
)
from omnipipe.util.field_error import FieldError


@dataclass(frozen=True)
class TalkerOptions(DecoderCheckpointOptions):
    """``max_new_tokens``: a request's cap in codec codes (50 per second) when its talker SamplingParams give no
    ``max_tokens`` (its KV is reserved for its prompt and that many codes), the name every family's decoder stage
    gives its cap; ``max_codes`` is its older name here. ``speaker``: the voice of a request that names none (a
    name in the checkpoint's spk_dict.pt, any case; default ``DEFAULT_SPEAKER``), the option Qwen3's talker has."""

    max_new_tokens: int = 2048
    max_codes: int | None = None
    speaker: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_codes is not None:
            if self.max_new_tokens != 2048:
                raise FieldError("max_codes", "is max_new_tokens's older name: give one of them")
            positive_int("max_codes", self.max_codes, 1 << 20)
            object.__setattr__(self, "max_new_tokens", self.max_codes)
        positive_int("max_new_tokens", self.max_new_tokens, 1 << 20)
        if self.speaker is not None and (not isinstance(self.speaker, str) or not self.speaker):
            raise FieldError("speaker", f"must be a voice name, got {self.speaker!r}")


@dataclass(frozen=True)
class Token2WavOptions(CheckpointOptions):
    """``dtype`` defaults to float32 here (the DiT's ODE steps and BigVGAN are kept in full precision);
    ``vocoder_left_mel``: mel frames of left context BigVGAN reads before a window (48)."""

    dtype: str = "float32"
    vocoder_left_mel: int = 48

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("vocoder_left_mel", self.vocoder_left_mel, 4096)

"""The stage options of the Qwen3-Omni talker and vocoder (deploy ``stages.<name>.options``) beyond what every
checkpoint stage takes (``stage/checkpoint_options.py``: model, dtype, gpu_memory_fraction, torch_compile); the
thinker takes exactly a multimodal thinker's (``MultimodalThinkerOptions`` there)."""

from __future__ import annotations

from dataclasses import dataclass

from omnipipe.stage.checkpoint_options import (
    CheckpointOptions,
    DecoderCheckpointOptions,
    positive_int,
)
from omnipipe.util.field_error import FieldError

DEFAULT_SPEAKER = "ethan"  # the voice of a request that names none, where the checkpoint has it (any case)


@dataclass(frozen=True)
class TalkerOptions(DecoderCheckpointOptions):
    """A batched decoder stage's options (``DecoderCheckpointOptions``: the KV budget, prefill pieces,
    ``step_per_request``) and: ``speaker``, the voice (default: ``DEFAULT_SPEAKER`` where the checkpoint has it,
    else its first); ``max_new_tokens``, a request's cap in codec frames (12.5 per second) when its SamplingParams
    give no ``max_tokens``."""

    speaker: str | None = None
    max_new_tokens: int = 4096

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.speaker is not None and (not isinstance(self.speaker, str) or not self.speaker):
            raise FieldError("speaker", f"must be a voice name, got {self.speaker!r}")
        positive_int("max_new_tokens", self.max_new_tokens, 1 << 20)


@dataclass(frozen=True)
class Qwen3TalkerParams:
    """The talker's ``SamplingParams.extra``: ``speaker`` is the voice of this request (a name in the checkpoint's
    ``talker_config.speaker_id``, any case); None: the stage option's."""

    speaker: str | None = None

    def __post_init__(self) -> None:
        if self.speaker is not None and (not isinstance(self.speaker, str) or not self.speaker):
            raise FieldError("speaker", f"must be a voice name, got {self.speaker!r}")


@dataclass(frozen=True)
class Code2WavOptions(CheckpointOptions):
    """Only what every checkpoint stage takes."""

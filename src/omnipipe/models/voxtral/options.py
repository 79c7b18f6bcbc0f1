"""The Voxtral thinker's stage options (deploy ``stages.thinker.options``) beyond a batched decoder's
(``stage/checkpoint_options.py``: model, dtype, the KV budget, prefill pieces, prefix caching), and what a
transcription request gives it (``VoxtralTranscriptionParams``: its language)."""

from __future__ import annotations

from dataclasses import dataclass

from omnipipe.models.voxtral.pipeline import LANGUAGES
from omnipipe.stage.checkpoint_options import DecoderCheckpointOptions, positive_int
from omnipipe.util.field_error import FieldError


@dataclass(frozen=True)
class VoxtralThinkerOptions(DecoderCheckpointOptions):
    """``max_new_tokens``: a request's cap when its SamplingParams leave ``max_tokens`` out."""

    max_new_tokens: int = 1024

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("max_new_tokens", self.max_new_tokens, 1 << 20)


@dataclass(frozen=True)
class VoxtralTranscriptionParams:
    """A transcription's ``SamplingParams.extra`` for the thinker: ``language``, one of ``LANGUAGES`` (None: the
    model hears it)."""

    language: str | None = None

    def __post_init__(self) -> None:
        if self.language is not None and self.language not in LANGUAGES:
            raise FieldError("language", f"must be one of {', '.join(LANGUAGES)}, got {self.language!r}")

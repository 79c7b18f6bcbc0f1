"""The Voxtral thinker's stage options (deploy ``stages.thinker.options``) beyond a batched decoder's
(``stage/checkpoint_options.py``: model, dtype, the KV budget, prefill pieces, prefix caching)."""

from __future__ import annotations

from dataclasses import dataclass

from omnipipe.stage.checkpoint_options import DecoderCheckpointOptions, positive_int


@dataclass(frozen=True)
class VoxtralThinkerOptions(DecoderCheckpointOptions):
    """``max_new_tokens``: a request's cap when its SamplingParams leave ``max_tokens`` out."""

    max_new_tokens: int = 1024

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("max_new_tokens", self.max_new_tokens, 1 << 20)

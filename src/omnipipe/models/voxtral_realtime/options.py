"""The Voxtral Realtime transcriber's options (deploy ``stages.transcriber.options``) beyond a batched decoder's
(``stage/checkpoint_options.py``: model, dtype, the KV budget, prefill pieces, prefix caching)."""

from __future__ import annotations

from dataclasses import dataclass

from omnipipe.stage.checkpoint_options import DecoderCheckpointOptions, positive_int

MAX_AUDIO_STREAMS = 1024
MAX_STREAM_S = 3600


@dataclass(frozen=True)
class VoxtralRealtimeOptions(DecoderCheckpointOptions):
    """``audio_streams``: the live audio streams the stage keeps open at once (appended to with
    ``AsyncOmni.append_audio``; each holds its encoder's caches on the device: the released encoder's sliding window
    of 750 frames is ~200 MB in bfloat16). ``max_stream_s``: the seconds one live stream may hold (its session
    reserves the KV of that many positions, within the language model's ``max_position_embeddings``)."""

    audio_streams: int = 32
    max_stream_s: int = 300

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("audio_streams", self.audio_streams, MAX_AUDIO_STREAMS)
        positive_int("max_stream_s", self.max_stream_s, MAX_STREAM_S)

"""The Moshi duplex stage's options (deploy ``stages.duplex.options``) beyond a batched decoder's
(``stage/checkpoint_options.py``: model, dtype, the KV budget, prefill pieces, prefix caching)."""

from __future__ import annotations

from dataclasses import dataclass

from omnipipe.stage.checkpoint_options import DecoderCheckpointOptions, positive_int

MAX_AUDIO_STREAMS = 1024


@dataclass(frozen=True)
class MoshiDuplexOptions(DecoderCheckpointOptions):
    """``max_frames``: a session's cap in user frames (80 ms each) when its SamplingParams leave ``max_tokens`` out;
    None: as many as the temporal transformer's sliding window holds after the prompt (3000 columns, 4 minutes, for
    the released checkpoints), the most that stays exact. ``audio_streams``: the live user-audio streams the stage
    keeps open at once (appended to with ``AsyncOmni.append_audio``). Prefix caching is off by default: a session's
    columns hold its own user's audio, so sessions share no blocks (only the same prompt would)."""

    max_frames: int | None = None
    audio_streams: int = 32
    prefix_caching: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_frames is not None:
            positive_int("max_frames", self.max_frames, 1 << 20)
        positive_int("audio_streams", self.audio_streams, MAX_AUDIO_STREAMS)

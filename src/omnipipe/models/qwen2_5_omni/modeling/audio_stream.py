"""Qwen2.5-Omni's audio encoder cut where the model cuts it, for audio that streams in (``stage/streaming_audio.py``).

transformers' ``Qwen2_5OmniAudioEncoder`` splits a clip's log-mel frames into chunks of ``n_window * 2``, convolves
each alone (a tail chunk is zero-padded and its padding masked after the first convolution, the same as convolving
it alone), attends within each chunk (``cu_seqlens`` per chunk), then pools pairs of frames (a chunk's embedding
count is even, so no pair crosses chunks) and projects each. A chunk's output is final once its frames are: the
encoder's window is one chunk, run by the tower's own forward over that chunk alone."""

from __future__ import annotations

from typing import Any

import torch

from omnipipe.stage.streaming_audio import LogMelStream, StreamingAudioInput

WHOLE_CLIP_SAMPLES = 480_000  # the processor pads (and cuts) every clip to Whisper's 30 s


class Qwen25ChunkEncoder:
    """``ChunkEncoder`` over a ``Qwen2_5OmniAudioEncoder`` (the thinker model's ``audio_tower``)."""

    window_chunks = 1

    def __init__(self, audio_tower: Any) -> None:
        self.tower = audio_tower
        self.chunk_frames = 2 * int(audio_tower.n_window)

    def embed(self, features: torch.Tensor, padded_frames: int) -> torch.Tensor:
        return features  # the chunk is convolved with its window, in ``encode``

    @torch.inference_mode()
    def encode(self, embeds: list[torch.Tensor], frames: list[int]) -> torch.Tensor:
        features = torch.cat(embeds, dim=1)
        weight = self.tower.conv1.weight
        lengths = torch.tensor([int(features.shape[1])], device=weight.device)
        after_cnn, _ = self.tower._get_feat_extract_output_lengths(lengths)
        out = self.tower(features.to(weight.device, weight.dtype), feature_lens=lengths, aftercnn_lens=after_cnn)
        return out.last_hidden_state


def streaming_audio(feature_extractor: Any, thinker: Any | None) -> StreamingAudioInput:
    """A clip streamed into a Qwen2.5-Omni thinker (``Qwen2_5OmniThinkerForConditionalGeneration``; None: only
    the features stream), with the processor's ``feature_extractor``."""
    encoder = Qwen25ChunkEncoder(thinker.model.audio_tower) if thinker is not None else None
    return StreamingAudioInput(LogMelStream(feature_extractor, WHOLE_CLIP_SAMPLES), encoder)

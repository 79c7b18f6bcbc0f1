"""Qwen3-Omni's audio encoder cut where the model cuts it, for audio that streams in (``stage/streaming_audio.py``).

transformers' ``Qwen3OmniMoeAudioEncoder`` splits a clip's log-mel frames into chunks of ``n_window * 2`` and
convolves each alone (three stride-2 2-D convolutions, a projection, positions counted from the chunk's start); a
tail chunk is zero-padded to the longest chunk of the call with nothing masked, so its embedding depends on that
padding and is made with it. Attention then stays within windows of ``n_window_infer`` frames
(``n_window_infer // (n_window * 2)`` chunks), followed by per-frame projections. So a chunk is embedded as soon as
its frames are in, and a window encoded as soon as its chunks are; the last, partial window waits for the end."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from omnipipe.stage.streaming_audio import LogMelStream, StreamingAudioInput


class Qwen3ChunkEncoder:
    """``ChunkEncoder`` over a ``Qwen3OmniMoeAudioEncoder`` (the thinker model's ``audio_tower``)."""

    def __init__(self, audio_tower: Any) -> None:
        self.tower = audio_tower
        self.n_window = int(audio_tower.n_window)
        self.chunk_frames = 2 * self.n_window
        self.window_chunks = int(audio_tower.n_window_infer) // self.chunk_frames
        if self.window_chunks < 1:
            raise ValueError(f"audio_config.n_window_infer ({audio_tower.n_window_infer}) is shorter than a chunk "
                             f"(n_window * 2 = {self.chunk_frames})")

    @torch.inference_mode()
    def embed(self, features: torch.Tensor, padded_frames: int) -> torch.Tensor:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

        tower = self.tower
        weight = tower.conv2d1.weight
        frames = int(features.shape[1])
        x = F.pad(features, (0, padded_frames - frames))[None, None].to(weight.device, weight.dtype)
        x = F.gelu(tower.conv2d3(F.gelu(tower.conv2d2(F.gelu(tower.conv2d1(x))))))
        b, c, f, t = x.size()
        x = tower.conv_out(x.permute(0, 3, 1, 2).contiguous().view(b, t, c * f))
        x = x + tower.positional_embedding.positional_embedding[:t].unsqueeze(0).to(x.dtype)
        return x[0, :int(_get_feat_extract_output_lengths(torch.tensor(frames), self.n_window))]

    @torch.inference_mode()
    def encode(self, embeds: list[torch.Tensor], frames: list[int]) -> torch.Tensor:
        from transformers.utils.generic import get_max_seqlen

        tower = self.tower
        hidden = torch.cat(embeds)
        cu_seqlens = torch.tensor([0, int(hidden.shape[0])], dtype=torch.int32, device=hidden.device)
        max_seqlen = get_max_seqlen(cu_seqlens, tower.config)
        for layer in tower.layers:
            hidden = layer(hidden, cu_seqlens, max_seqlen=max_seqlen)[0]
        return tower.proj2(tower.act(tower.proj1(tower.ln_post(hidden))))


def streaming_audio(feature_extractor: Any, thinker: Any | None) -> StreamingAudioInput:
    """A clip streamed into a Qwen3-Omni thinker (``Qwen3OmniMoeThinkerForConditionalGeneration``; None: only the
    features stream), with the checkpoint's ``feature_extractor`` (the clip taken whole: no padding, no cut)."""
    encoder = Qwen3ChunkEncoder(thinker.model.audio_tower) if thinker is not None else None
    return StreamingAudioInput(LogMelStream(feature_extractor, None), encoder)

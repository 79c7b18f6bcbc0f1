"""The Qwen2.5-Omni processor without a separate video processor: videos go through the image processor, frame by
frame, and their patches are grouped in time the way Qwen2-VL's video processor groups them. Needs no
torchvision. A clip that streamed in (a finished ``StreamedAudio``, ``stage/streaming_audio.py``) is taken as an
audio input: its features are used as they are and its placeholder is written for them."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers.feature_extraction_utils import BatchFeature
from transformers.models.qwen2_5_omni import Qwen2_5OmniProcessor
from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

from omnipipe.stage.streaming_audio import StreamedAudio


class FramesVideoProcessor:
    """Videos ([T, H, W, 3] uint8 arrays) -> ``pixel_values_videos`` [T/t * h * w, C * t * p * p] and
    ``video_grid_thw`` [t', h, w], through an image processor's resize / rescale / normalise."""

    def __init__(self, image_processor: Any) -> None:
        self.image_processor = image_processor
        self.temporal_patch_size = int(image_processor.temporal_patch_size)
        self.merge_size = int(image_processor.merge_size)
        self.patch_size = int(image_processor.patch_size)

    def __call__(self, videos: Any, **kwargs: Any) -> BatchFeature:
        if isinstance(videos, np.ndarray) and videos.ndim == 4:
            videos = [videos]
        all_patches, grids = [], []
        for video in videos:
            frames = np.asarray(video)
            if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
                raise ValueError(f"a video must be a [T, H, W, 3] array of frames, got shape {frames.shape}")
            remainder = len(frames) % self.temporal_patch_size
            if remainder:
                pad = np.repeat(frames[-1:], self.temporal_patch_size - remainder, axis=0)
                frames = np.concatenate([frames, pad])
            out = self.image_processor(images=list(frames), return_tensors="np")
            pixels, grid = out["pixel_values"], out["image_grid_thw"]
            _, grid_h, grid_w = (int(v) for v in grid[0])
            tp, p = self.temporal_patch_size, self.patch_size
            # every frame's patches repeat the frame tp times along time: keep one copy, then group frames by tp
            per_frame = pixels.reshape(len(frames), grid_h * grid_w, 3, tp, p, p)[:, :, :, 0]
            grouped = per_frame.reshape(len(frames) // tp, tp, grid_h * grid_w, 3, p, p).transpose(0, 2, 3, 1, 4, 5)
            all_patches.append(grouped.reshape(-1, 3 * tp * p * p))
            grids.append([len(frames) // tp, grid_h, grid_w])
        return BatchFeature({"pixel_values_videos": np.concatenate(all_patches).astype(np.float32),
                             "video_grid_thw": np.array(grids, dtype=np.int64)})


class OmniProcessor(Qwen2_5OmniProcessor):
    """``Qwen2_5OmniProcessor`` built from an image processor, a feature extractor and a tokenizer; its video
    processor is :class:`FramesVideoProcessor` over the image processor."""

    def __init__(self, image_processor=None, feature_extractor=None, tokenizer=None, chat_template=None):
        super(Qwen2_5OmniProcessor, self).__init__(image_processor, feature_extractor, tokenizer,
                                                   chat_template=chat_template)
        self.video_processor = FramesVideoProcessor(image_processor)
        for name in ("image_token", "audio_token", "video_token", "image_token_id", "audio_token_id",
                     "video_token_id", "vision_bos_token", "vision_eos_token", "audio_bos_token", "audio_eos_token"):
            setattr(self, name, getattr(tokenizer, name))

    def prepare_inputs_layout(self, images: Any = None, text: Any = None, videos: Any = None, audio: Any = None,
                              **kwargs: Any) -> tuple[Any, Any, Any, Any]:
        streamed = _streamed(audio)
        images, text, videos, audio = super().prepare_inputs_layout(
            images=images, text=text, videos=videos, audio=None if streamed else audio, **kwargs)
        return images, text, videos, streamed or audio

    def _process_audio(self, audio: Any, **kwargs: Any) -> tuple[Any, list[str]]:
        streamed = _streamed(audio)
        if not streamed:
            return super()._process_audio(audio, **kwargs)
        masks = [clip.feature_attention_mask for clip in streamed]
        if len({int(mask.shape[1]) for mask in masks}) != 1:
            raise ValueError("streamed clips of different padded lengths cannot be batched")
        inputs = BatchFeature({"input_features": torch.cat([clip.input_features for clip in streamed]),
                               "feature_attention_mask": torch.cat(masks)})
        inputs["num_audio_tokens"] = _get_feat_extract_output_lengths(inputs["feature_attention_mask"].sum(-1))
        return inputs, [self.replace_audio_token(dict(inputs), audio_idx=i) for i in range(len(streamed))]


def _streamed(audio: Any) -> list[StreamedAudio] | None:
    """``audio`` as finished streams, if it is a list of them."""
    if isinstance(audio, (list, tuple)) and audio and all(isinstance(clip, StreamedAudio) for clip in audio):
        return list(audio)
    return None

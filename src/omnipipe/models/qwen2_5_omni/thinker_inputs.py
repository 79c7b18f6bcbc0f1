"""The thinker's inputs from a request, made by the checkpoint's own processor (``modeling/processor.py``): the chat
template over the conversation, the tokenizer, the feature extractor for audio, the image processor for images and
video frames; video files are sampled at the stage's ``video_fps`` (at most ``video_max_frames`` frames). The
thinker runs it on a background thread, off the stage loop. A clip that streamed in (``stage/streaming_audio.py``:
a finished ``StreamedAudio``, the request's only audio) brings its features, and its audio encoder output as
``audio_embeds`` (for ``merge_audio_embeds``), made already (``OmniProcessor`` takes it as a clip)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnipipe.models.qwen2_5_omni.modeling.processor import OmniProcessor
from omnipipe.models.qwen2_5_omni.processors import chat_messages
from omnipipe.stage.streaming_audio import streamed_clip
from omnipipe.util.media import load_video

# the processor's outputs the thinker's encoders read, besides input_ids and attention_mask
MEDIA_KEYS = ("pixel_values", "image_grid_thw", "input_features", "feature_attention_mask",
              "pixel_values_videos", "video_grid_thw", "video_second_per_grid")


class ThinkerInputs:
    """A thinker input (``text``, ``history``, ``images``, ``audios``, ``videos``, ``video_fields``) -> the
    processor's tensors (on the CPU)."""

    def __init__(self, directory: Path, video_fps: float, video_max_frames: int) -> None:
        self.processor = OmniProcessor.from_pretrained(directory, local_files_only=True)
        self.tokenizer = self.processor.tokenizer
        self.video_fps, self.video_max_frames = video_fps, video_max_frames

    def __call__(self, data: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Raises ``FieldError`` naming the video that cannot be decoded."""
        text = self.processor.apply_chat_template(chat_messages(data), add_generation_prompt=True, tokenize=False)
        given = data.get("videos") or []
        fields = data.get("video_fields") or [f"prompt.multi_modal_data.video[{i}]" for i in range(len(given))]
        videos = [load_video(v, field, self.video_fps, self.video_max_frames)
                  for v, field in zip(given, fields, strict=False)]
        streamed = streamed_clip(data.get("audios") or [])  # the processor takes its features as they are
        inputs = self.processor(text=[text], images=data.get("images") or None, audio=data.get("audios") or None,
                                videos=videos or None, fps=float(self.video_fps), return_tensors="pt")
        out = {k: torch.as_tensor(v) for k, v in inputs.items() if k in ("input_ids", "attention_mask") + MEDIA_KEYS}
        if streamed is not None and streamed.audio_embeds is not None:
            out["audio_embeds"] = streamed.audio_embeds
        return out

"""The thinker's inputs from a request: the chat text with one placeholder run per image, video and audio clip,
tokenised, beside the tensors the thinker's encoders read (image and video patches with their grids, log-mel
features with their masks). It uses the checkpoint's own tokenizer, image processor and feature extractor. A clip
that streamed in (``stage/streaming_audio.py``: a finished ``StreamedAudio``, the request's only audio) brings its
features, and its audio encoder output as ``audio_embeds`` (for ``merge_audio_embeds``), made already.

Videos are patchified here from their sampled frames (consecutive frames paired into temporal patches, the last
repeated to fill a pair), so no video-processing backend is needed; each frame is resized and normalised by the
image processor exactly as an image is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnipipe.stage.streaming_audio import streamed_clip
from omnipipe.stage.structured_output import TOOLS_INTRO, TOOLS_OUTRO, tool_json
from omnipipe.util.field_error import FieldError

IMAGE_PART = "<|vision_start|>{}<|vision_end|>"
AUDIO_PART = "<|audio_start|>{}<|audio_end|>"


def _turn(turn: dict[str, Any], before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """One earlier turn as the template writes it (a tool result opens or closes the user turn its run shares)."""
    role, content = turn["role"], turn["content"]
    if role == "tool":
        opening = "<|im_start|>user" if before is None or before["role"] != "tool" else ""
        closing = "<|im_end|>\n" if after is None or after["role"] != "tool" else ""
        return f"{opening}\n<tool_response>\n{content}\n</tool_response>{closing}"
    calls = "".join(("\n" if i or content else "") + '<tool_call>\n{"name": "' + call["name"] + '", "arguments": '
                    + call["arguments"] + "}\n</tool_call>" for i, call in enumerate(turn.get("tool_calls") or []))
    return f"<|im_start|>{role}\n{content}{calls}<|im_end|>\n"


def audio_token_count(feature_frames: int, n_window: int) -> int:
    """How many thinker tokens an audio clip of ``feature_frames`` log-mel frames becomes."""
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    return int(_get_feat_extract_output_lengths(torch.tensor(feature_frames), n_window))


class ThinkerInputBuilder:
    """Turns a thinker request item (``text``, ``history``, ``images``, ``audios``, ``videos``, ``video_fps``) into
    the keyword arguments of the thinker's forward."""

    def __init__(self, directory: Path, config: Any) -> None:
        from transformers import AutoTokenizer, Qwen2VLImageProcessorPil, WhisperFeatureExtractor

        self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(directory, local_files_only=True)
        self.feature_extractor = WhisperFeatureExtractor.from_pretrained(directory, local_files_only=True)
        self.n_window = int(config.thinker_config.audio_config.n_window)
        self.merge = int(self.image_processor.merge_size)

    def chat_text(self, item: dict[str, Any], placeholders: list[str]) -> str:
        """The conversation as Qwen3's chat template writes it: with tools, a system turn listing them (after the
        conversation's first system message, when it starts with one), the assistant's calls as ``<tool_call>``
        blocks and consecutive tool results as one user turn of ``<tool_response>`` blocks. A conversation that
        ends with tool results (no question) has the model go on from them."""
        history = list(item.get("history", []))
        tools = item.get("tools") or []
        turns: list[str] = []
        if tools:
            system = ""
            if history and history[0]["role"] == "system":
                system, history = history[0]["content"] + "\n\n", history[1:]
            listed = "".join("\n" + tool_json(tool) for tool in tools)
            turns.append(f"<|im_start|>system\n{system}{TOOLS_INTRO}{listed}{TOOLS_OUTRO}<|im_end|>\n")
        for i, turn in enumerate(history):
            turns.append(_turn(turn, history[i - 1] if i else None, history[i + 1] if i + 1 < len(history) else None))
        if item.get("text") or placeholders or not history or history[-1]["role"] != "tool":
            turns.append(f"<|im_start|>user\n{''.join(placeholders)}{item.get('text', '')}<|im_end|>\n")
        return "".join(turns) + "<|im_start|>assistant\n"

    def images(self, images: list[np.ndarray]) -> dict[str, torch.Tensor]:
        from PIL import Image

        out = self.image_processor(images=[Image.fromarray(np.asarray(i, dtype=np.uint8)) for i in images],
                                   return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    def video(self, frames: np.ndarray, fps: float) -> tuple[torch.Tensor, torch.Tensor, float]:
        """[T, H, W, 3] uint8 frames sampled at ``fps`` -> (patches, grid [1, 3], seconds per temporal patch)."""
        from PIL import Image

        temporal = int(self.image_processor.temporal_patch_size)
        padded = list(np.asarray(frames, dtype=np.uint8))
        while len(padded) % temporal:
            padded.append(padded[-1])
        per_frame = self.image_processor(images=[Image.fromarray(f) for f in padded], return_tensors="np")
        grid = per_frame["image_grid_thw"]
        patches_per_frame = int(grid[0, 1] * grid[0, 2])
        channels = 3
        patch = int(self.image_processor.patch_size)
        # every frame's patches carry the frame ``temporal`` times; keep one copy and pair frames instead
        single = per_frame["pixel_values"].reshape(len(padded), patches_per_frame, channels, temporal, patch, patch)
        single = single[:, :, :, 0]
        grid_t = len(padded) // temporal
        paired = single.reshape(grid_t, temporal, patches_per_frame, channels, patch, patch)
        paired = paired.transpose(0, 2, 3, 1, 4, 5).reshape(grid_t * patches_per_frame,
                                                              channels * temporal * patch * patch)
        thw = torch.tensor([[grid_t, int(grid[0, 1]), int(grid[0, 2])]])
        return torch.from_numpy(np.ascontiguousarray(paired)), thw, temporal / fps

    def __call__(self, item: dict[str, Any]) -> dict[str, torch.Tensor]:
        placeholders: list[str] = []
        kwargs: dict[str, Any] = {}
        images = item.get("images") or []
        if images:
            kwargs.update(self.images(images))
            for thw in kwargs["image_grid_thw"]:
                placeholders.append(IMAGE_PART.format("<|image_pad|>" * (int(thw.prod()) // self.merge ** 2)))
        videos = item.get("videos") or []
        if videos:
            fps = float(item.get("video_fps", 2.0))
            patches, grids, seconds = zip(*(self.video(v, fps) for v in videos), strict=True)
            kwargs["pixel_values_videos"] = torch.cat(patches)
            kwargs["video_grid_thw"] = torch.cat(grids)
            kwargs["video_second_per_grid"] = torch.tensor(seconds)
            for thw in kwargs["video_grid_thw"]:
                placeholders.append(IMAGE_PART.format("<|video_pad|>" * (int(thw.prod()) // self.merge ** 2)))
        audios = item.get("audios") or []
        streamed = streamed_clip(audios)
        if streamed is not None:  # features (and the encoder's output) made while the clip streamed in
            kwargs["input_features"] = streamed.input_features
            kwargs["feature_attention_mask"] = streamed.feature_attention_mask
            if streamed.audio_embeds is not None:
                kwargs["audio_embeds"] = streamed.audio_embeds
            frames = int(streamed.feature_attention_mask.sum())
            placeholders.append(AUDIO_PART.format("<|audio_pad|>" * audio_token_count(frames, self.n_window)))
        elif audios:
            features = self.feature_extractor([np.asarray(a, dtype=np.float32) for a in audios], sampling_rate=16000,
                                              padding="longest", truncation=False, return_attention_mask=True,
                                              return_tensors="pt")
            kwargs["input_features"] = features["input_features"]
            kwargs["feature_attention_mask"] = features["attention_mask"]
            for i, frames in enumerate(features["attention_mask"].sum(-1).tolist()):
                if frames < 1:
                    raise FieldError(f"prompt.multi_modal_data.audio[{i}]", "the audio clip is empty")
                placeholders.append(AUDIO_PART.format("<|audio_pad|>" * audio_token_count(frames, self.n_window)))
        text = self.chat_text(item, placeholders)
        ids = self.tokenizer(text, return_tensors="pt")
        kwargs["input_ids"] = ids["input_ids"]
        kwargs["attention_mask"] = ids["attention_mask"]
        return kwargs

"""Voxtral's prompt, built here rather than by mistral-common (which transformers' ``VoxtralProcessor`` needs): the
checkpoint's ``tekken.json`` read as a BPE tokenizer by transformers' own converter, the conversation written with
Mistral's instruct layout, and the audio turned into log-mel windows of 30 s.

The layout (special tokens named as in ``tekken.json``; their ids are read from it, never assumed):

- chat: ``<s>``, then each earlier turn (``[SYSTEM_PROMPT]text[/SYSTEM_PROMPT]``, ``[INST]text[/INST]``,
  ``answer</s>``), then ``[INST]`` + for each clip ``[BEGIN_AUDIO]`` + ``[AUDIO]`` x its tokens + the question's
  text + ``[/INST]``;
- transcription: ``<s>[INST][BEGIN_AUDIO][AUDIO]...[/INST]`` + ``lang:xx`` when the language is given +
  ``[TRANSCRIBE]``.

A clip is zero-padded to a whole number of windows (``window_samples``: the encoder's ``2 x max_source_positions``
mel frames at the feature extractor's hop); each window becomes ``tokens_per_window`` placeholders (the encoder's
frames, four stacked into one: ``max_source_positions x d_model / intermediate_size``) and one row of
``input_features`` [windows, mel bins, frames], the clips' windows in the order the clips come."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnipipe.util.field_error import FieldError

TEKKEN_FILE = "tekken.json"
BOS, EOS = "<s>", "</s>"
BEGIN_INST, END_INST = "[INST]", "[/INST]"
BEGIN_SYSTEM, END_SYSTEM = "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"
AUDIO, BEGIN_AUDIO, TRANSCRIBE = "[AUDIO]", "[BEGIN_AUDIO]", "[TRANSCRIBE]"
SPECIAL_NAMES = (BOS, EOS, BEGIN_INST, END_INST, BEGIN_SYSTEM, END_SYSTEM, AUDIO, BEGIN_AUDIO, TRANSCRIBE)
TRANSCRIBE_TASK = "transcribe"  # a request item's ``task``: the transcription prompt instead of a chat turn


def load_tekken(directory: Path) -> Any:
    """The checkpoint's ``tekken.json`` as a transformers tokenizer (converted by transformers, without
    mistral-common)."""
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    path = directory / TEKKEN_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no {TEKKEN_FILE} (Voxtral's tokenizer)")
    return convert_tekken_tokenizer(str(path), chat_template="")


class VoxtralPrompts:
    """Turns a request item (``text``, ``history``, ``audios``: 16 kHz float arrays, ``task``, ``language``) into
    the model's ``input_ids`` [1, T] and ``input_features`` [windows, mel bins, frames] (absent without audio)."""

    def __init__(self, directory: Path, config: Any) -> None:
        from transformers import WhisperFeatureExtractor

        self.tokenizer = load_tekken(directory)
        self.feature_extractor = WhisperFeatureExtractor.from_pretrained(directory, local_files_only=True)
        vocab = self.tokenizer.get_vocab()
        missing = [name for name in SPECIAL_NAMES if name not in vocab]
        if missing:
            raise ValueError(f"{directory / TEKKEN_FILE}: lacks the special tokens {', '.join(missing)}")
        self.ids = {name: int(vocab[name]) for name in SPECIAL_NAMES}
        if self.ids[AUDIO] != int(config.audio_token_id):
            raise ValueError(f"{directory}: the config's audio_token_id {config.audio_token_id} is not "
                             f"{TEKKEN_FILE}'s {AUDIO} ({self.ids[AUDIO]})")
        audio = config.audio_config
        self.window_frames = 2 * int(audio.max_source_positions)  # mel frames the encoder reads at once
        self.window_samples = self.window_frames * int(self.feature_extractor.hop_length)
        self.tokens_per_window = int(audio.max_source_positions) * int(audio.hidden_size) // int(
            audio.intermediate_size)
        self.sample_rate_hz = int(self.feature_extractor.sampling_rate)

    def text_ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def window_count(self, samples: int) -> int:
        """The 30 s windows a clip of ``samples`` fills (its last one zero-padded; an empty clip still one)."""
        return max(1, -(-samples // self.window_samples))

    def windows(self, samples: np.ndarray) -> torch.Tensor:
        """A clip's log-mel windows [windows, mel bins, frames], the clip zero-padded to whole windows."""
        count = self.window_count(len(samples))
        padded = np.zeros(count * self.window_samples, dtype=np.float32)
        padded[:len(samples)] = samples
        features = self.feature_extractor(padded, sampling_rate=self.sample_rate_hz, return_tensors="pt",
                                          padding="do_not_pad", truncation=False)["input_features"][0]
        return features.reshape(features.shape[0], count, self.window_frames).transpose(0, 1).contiguous()

    def _audio_part(self, windows: int) -> list[int]:
        return [self.ids[BEGIN_AUDIO]] + [self.ids[AUDIO]] * (windows * self.tokens_per_window)

    def _history(self, history: list[dict[str, Any]]) -> list[int]:
        ids: list[int] = []
        for i, turn in enumerate(history):
            role, content = turn["role"], turn["content"]
            if role == "system":
                ids += [self.ids[BEGIN_SYSTEM], *self.text_ids(content), self.ids[END_SYSTEM]]
            elif role == "user":
                ids += [self.ids[BEGIN_INST], *self.text_ids(content), self.ids[END_INST]]
            elif role == "assistant" and not turn.get("tool_calls"):
                ids += [*self.text_ids(content), self.ids[EOS]]
            else:
                raise FieldError(f"prompt.history[{i}]", "Voxtral is served without tools: give system, user and "
                                 "assistant turns of text")
        return ids

    def __call__(self, item: dict[str, Any]) -> dict[str, torch.Tensor]:
        clips = [self.windows(np.asarray(samples, dtype=np.float32)) for samples in item.get("audios") or []]
        audio_ids = [token for clip in clips for token in self._audio_part(int(clip.shape[0]))]
        ids = [self.ids[BOS]]
        if item.get("task") == TRANSCRIBE_TASK:
            if len(clips) != 1 or item.get("text") or item.get("history"):
                raise FieldError("prompt", "a transcription takes one audio clip and no text")
            ids += [self.ids[BEGIN_INST], *audio_ids, self.ids[END_INST]]
            if item.get("language"):
                ids += self.text_ids(f"lang:{item['language']}")
            ids.append(self.ids[TRANSCRIBE])
        else:
            ids += self._history(list(item.get("history") or []))
            ids += [self.ids[BEGIN_INST], *audio_ids, *self.text_ids(item.get("text") or ""), self.ids[END_INST]]
        out = {"input_ids": torch.tensor([ids], dtype=torch.long)}
        if clips:
            out["input_features"] = torch.cat(clips)
        return out

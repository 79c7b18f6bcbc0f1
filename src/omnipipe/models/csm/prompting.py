"""CSM's prompt, as sesame/csm-1b's chat template writes it: every turn is
``<|begin_of_text|>[speaker]text<|end_of_text|>``; a turn the model hears (a context clip) is followed by one
``<|AUDIO|>`` a Mimi frame of the clip and ``<|audio_eos|>``; the text to say is the last turn, without audio. The
ids of the four special tokens are read from the tokenizer and checked against the config's.

A context clip (float32 mono at 24 kHz) takes as many placeholders as Mimi's encoder gives it frames
(``MimiModel.get_encoded_length``, the count transformers' processor makes); a clip given as codes (a voice made
from a clip, ``reference_voice.py``) takes one a frame. The positions a prompt takes are checked against the
model's ``max_position_embeddings`` here, before any clip is encoded: the part that crosses it is refused, named."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnipipe.models.csm.weights.load import load_tokenizer
from omnipipe.util.field_error import FieldError

SAMPLE_RATE_HZ = 24000
FRAME_RATE_HZ = 12.5
BOS, EOS, AUDIO, AUDIO_EOS = "<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>"


@dataclass
class Turn:
    """A turn of the prompt: who says it and its text; a context turn has its audio (``samples``, or Mimi's
    ``codes`` [frames, codebooks]). ``text_field``/``audio_field``: the fields they came in (named when they are
    refused)."""

    speaker: str
    text: str
    samples: np.ndarray | None = None
    codes: torch.Tensor | None = None
    text_field: str = "prompt"
    audio_field: str = "prompt"

    @property
    def heard(self) -> bool:
        return self.samples is not None or self.codes is not None


@dataclass
class CsmPrompt:
    """A prompt's ``input_ids`` [T] and its heard turns, each with the position of its first ``<|AUDIO|>`` and
    its frames."""

    input_ids: torch.Tensor
    audio: list[tuple[int, int, Turn]] = field(default_factory=list)  # (start, frames, turn)


class CsmPrompts:
    """Builds a prompt's ids from its turns (``turns``: the context, heard; ``text``/``speaker``: what to say)."""

    def __init__(self, directory: Path, config: Any, codec: Any) -> None:
        self.tokenizer = load_tokenizer(directory)
        vocab = self.tokenizer.get_vocab()
        missing = [name for name in (BOS, EOS, AUDIO, AUDIO_EOS) if name not in vocab]
        if missing:
            raise ValueError(f"{directory}: the tokenizer lacks the special tokens {', '.join(missing)}")
        self.ids = {name: int(vocab[name]) for name in (BOS, EOS, AUDIO, AUDIO_EOS)}
        for name, key in ((AUDIO, "audio_token_id"), (AUDIO_EOS, "audio_eos_token_id")):
            if self.ids[name] != int(getattr(config, key)):
                raise ValueError(f"{directory}: the config's {key} {getattr(config, key)} is not the tokenizer's "
                                 f"{name} ({self.ids[name]})")
        self.codec = codec
        self.max_positions = int(config.max_position_embeddings)

    def text_ids(self, speaker: str, text: str) -> list[int]:
        """A turn's text part: ``<|begin_of_text|>[speaker]text<|end_of_text|>``."""
        return [self.ids[BOS], *self.tokenizer.encode(f"[{speaker}]{text}", add_special_tokens=False),
                self.ids[EOS]]

    def frames(self, turn: Turn) -> int:
        """The placeholders a heard turn takes: its codes' frames, or the frames Mimi encodes its samples to."""
        if turn.codes is not None:
            return int(turn.codes.shape[0])
        assert turn.samples is not None  # a heard turn has one or the other
        return int(self.codec.get_encoded_length(torch.tensor(len(turn.samples))))

    def __call__(self, turns: list[Turn], speaker: str, text: str) -> CsmPrompt:
        """The prompt of ``turns`` then ``text`` said by ``speaker``; a FieldError naming the part that takes it past
        the model's positions (at least one must be left for the first frame)."""
        ids: list[int] = []
        audio: list[tuple[int, int, Turn]] = []
        for turn in [*turns, Turn(speaker, text)]:
            ids += self.text_ids(turn.speaker, turn.text)
            if len(ids) >= self.max_positions:
                raise FieldError(turn.text_field, f"the text takes the prompt to {len(ids)} positions: the model has "
                                 f"{self.max_positions}, and a reply needs at least one")
            if not turn.heard:
                continue
            frames = self.frames(turn)
            audio.append((len(ids), frames, turn))
            ids += [self.ids[AUDIO]] * frames + [self.ids[AUDIO_EOS]]
            if len(ids) >= self.max_positions:
                raise FieldError(turn.audio_field, f"the clip's {frames} frames ({frames / FRAME_RATE_HZ:.1f} s) take "
                                 f"the prompt to {len(ids)} positions: the model has {self.max_positions}, and a "
                                 "reply needs at least one; give a shorter clip")
        return CsmPrompt(torch.tensor(ids, dtype=torch.long), audio)

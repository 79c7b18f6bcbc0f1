"""What the toy pipeline must produce for a prompt, computed without the engine."""

from __future__ import annotations

import numpy as np
import torch

from omnipipe.models.toy.runners.talker import ToyTalkerModel
from omnipipe.models.toy.runners.vocoder import decode_whole


def expected_text(prompt: str, max_tokens: int | None = None) -> str:
    text = prompt.upper()
    return text[:max_tokens] if max_tokens else text


def expected_audio(text: str, frames_per_char: int = 4) -> np.ndarray:
    ids = torch.tensor(list(text.encode("latin-1")), dtype=torch.long)
    with torch.inference_mode():
        frames = ToyTalkerModel(frames_per_char)(ids).numpy()
    return decode_whole(frames)

"""Tiny Qwen-Omni checkpoints whose thinker hears its audio: the random tiny audio tower maps every clip to nearly
the same output (its convolutions' small weights and zero biases leave little of the features past ``ln_post``),
so a test that compares answers to streamed and whole clips would pass whatever audio the thinker got. Here the
tower's convolutions and projections are redrawn at unit gain (the convolutions' biases at unit scale), the last
projection scaled (Qwen3's to the text embeddings' size), so two different clips give different greedy answers
(each test checks that they do)."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

_REDRAWN = re.compile(r"thinker\.audio_tower\.(conv\w*\.(weight|bias)|proj\d?\.weight)$")
# the tower's output projection, and its scale (of unit gain) at which two clips' greedy answers differ (measured)
_LAST = {"qwen3_omni": ("proj2", 0.03), "qwen2_5_omni": ("proj", 1.0)}


def write_hearing_checkpoint(family: str, directory: Path, seed: int = 0) -> Path:
    """The family's tiny checkpoint (``weights/tiny.py``) at ``directory``, its audio tower redrawn to hear."""
    if family == "qwen3_omni":
        from omnipipe.models.qwen3_omni.weights.tiny import write_tiny_checkpoint
    else:
        from omnipipe.models.qwen2_5_omni.weights.tiny import write_tiny_checkpoint
    write_tiny_checkpoint(directory, seed=seed)
    path = directory / "model.safetensors"
    tensors = load_file(path)
    generator = torch.Generator().manual_seed(seed + 1)
    redrawn = 0
    for name in sorted(tensors):
        match = _REDRAWN.search(name)
        if match is None:
            continue
        value = tensors[name]
        drawn = torch.randn(value.shape, generator=generator, dtype=torch.float32)
        if name.endswith(".weight"):
            drawn /= value[0].numel() ** 0.5
            last, scale = _LAST[family]
            if name.endswith(f".{last}.weight"):
                drawn *= scale
        tensors[name] = drawn.to(value.dtype)
        redrawn += 1
    if not redrawn:
        raise RuntimeError(f"{path}: no audio tower weights found to redraw")
    save_file(tensors, path, metadata={"format": "pt"})
    return directory

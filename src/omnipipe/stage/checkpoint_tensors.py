"""What a stage reads of a checkpoint's safetensors without building a model: its weight files (in the index's
order, or every ``*.safetensors``), some named tensors, some rows of one 2-D tensor (a talker reads the thinker's
embeddings of a few tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / name for name in names]
    return sorted(directory.glob("*.safetensors"))


def read_tensors(directory: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The named tensors of the checkpoint (only those are read)."""
    from safetensors import safe_open

    wanted, found = set(names), {}
    for file in weight_files(directory):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for key in wanted.intersection(handle.keys()):
                found[key] = handle.get_tensor(key)
    return found


def read_rows(directory: Path, name: str, rows: list[int]) -> torch.Tensor | None:
    """Some rows of one 2-D tensor of the checkpoint (only those are read), or None if it has no such tensor."""
    from safetensors import safe_open

    for file in weight_files(directory):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            if name in handle.keys():  # noqa: SIM118 - a safetensors handle is no mapping: it has keys() only
                table = handle.get_slice(name)
                return torch.stack([table[row:row + 1][0] for row in rows])
    return None

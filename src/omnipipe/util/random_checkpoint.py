"""A random checkpoint of a transformers model at any size, written without ever holding its weights: the model is
built on the ``meta`` device (shapes only), its tensors named as ``save_pretrained`` names them (transformers' own
reverse key mapping: fused MoE experts split per expert), and each tensor is drawn, written to its safetensors shard
and dropped before the next. Used by ``omnipipe tiny-checkpoint --size released``.

Values: biases 0, 1-D weights (norms, layer scales) 1, everything else normal(0, ``std``), each tensor from its own
seeded generator. ``edits`` change a tensor once drawn (e.g. an output layer's end-token rows)."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

SHARD_BYTES = 4 << 30
_DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
Edit = Callable[[torch.Tensor], None]


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the checkpoint, not yet drawn."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * torch.empty((), dtype=self.dtype).element_size()


def checkpoint_specs(model: torch.nn.Module, dtype: torch.dtype) -> list[TensorSpec]:
    """Every tensor ``save_pretrained`` would write for ``model`` (built on the meta device), in ``dtype``."""
    from transformers.core_model_loading import revert_weight_conversion

    saved = revert_weight_conversion(model, dict(model.state_dict()))
    return [TensorSpec(name, tuple(tensor.shape), dtype) for name, tensor in sorted(saved.items())]


def draw(spec: TensorSpec, seed: int, std: float, edits: dict[str, Edit]) -> torch.Tensor:
    """The tensor's random values (the same seed and name draw the same values)."""
    if spec.name.endswith(".bias"):
        value = torch.zeros(spec.shape)
    elif len(spec.shape) == 1:
        value = torch.ones(spec.shape)
    else:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(spec.name.encode()))
        value = torch.empty(spec.shape).normal_(0.0, std, generator=generator)
    if spec.name in edits:
        edits[spec.name](value)
    return value.to(spec.dtype)


def shards(specs: list[TensorSpec], shard_bytes: int = SHARD_BYTES) -> list[list[TensorSpec]]:
    """The specs in order, cut into shards of at most ``shard_bytes`` (a bigger tensor alone in its shard)."""
    out: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if out[-1] and size + spec.nbytes > shard_bytes:
            out.append([])
            size = 0
        out[-1].append(spec)
        size += spec.nbytes
    return out


def _header(specs: Iterable[TensorSpec]) -> bytes:
    entries, offset = {}, 0
    for spec in specs:
        entries[spec.name] = {"dtype": _DTYPE_NAMES[spec.dtype], "shape": list(spec.shape),
                              "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    raw = json.dumps({"__metadata__": {"format": "pt"}, **entries}, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the tensors' data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def write_shard(path: Path, specs: list[TensorSpec], tensors: Iterator[torch.Tensor]) -> None:
    """A safetensors file of ``specs``, each tensor taken from ``tensors`` as it is written (one in memory)."""
    with open(path, "wb") as handle:
        handle.write(_header(specs))
        for spec, tensor in zip(specs, tensors, strict=True):
            if tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
                raise ValueError(f"{spec.name}: drew {tuple(tensor.shape)} {tensor.dtype}, expected {spec}")
            handle.write(tensor.contiguous().view(torch.uint8).numpy().tobytes())


def write_random_checkpoint(directory: Path, specs: list[TensorSpec], seed: int, std: float = 0.02,
                            edits: dict[str, Edit] | None = None, shard_bytes: int = SHARD_BYTES) -> list[Path]:
    """``specs`` drawn and written into ``directory`` as ``model-XXXXX-of-YYYYY.safetensors`` with the index that
    ``from_pretrained`` follows (one ``model.safetensors`` when a shard holds them all)."""
    groups = shards(specs, shard_bytes)
    names = (["model.safetensors"] if len(groups) == 1 else
             [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))])
    weight_map = {}
    for name, group in zip(names, groups, strict=True):
        write_shard(directory / name, group, (draw(spec, seed, std, edits or {}) for spec in group))
        weight_map.update({spec.name: name for spec in group})
    if len(groups) > 1:
        index = {"metadata": {"total_size": sum(s.nbytes for s in specs)}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return [directory / name for name in names]

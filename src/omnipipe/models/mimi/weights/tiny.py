"""A tiny random Mimi for tests and for the tiny checkpoints of the families that hold one (CSM's ``codec_config``,
Moshi's ``audio_encoder_config``): toy widths, the released upsampling ratios and kernels (24 kHz, 1920 samples a
frame: CSM's processor assumes them), and codebooks filled with random centroids. A freshly built ``MimiModel``
has all-zero codebooks (``_init_weights`` zeroes ``embed_sum``): its decode then ignores the codes and its encode
returns code 0 everywhere, which is CSM's end-of-audio code. ``fill_codebooks`` fixes that on any model holding
Mimi."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# toy widths at the released geometry; the layer scale at 1 (released: 0.01) so the transformer's part of the
# decode is not lost under the convolutions' (a stream that got it wrong would still fail a test)
TINY_MIMI: dict[str, Any] = {
    "hidden_size": 32, "num_filters": 4, "codebook_dim": 32, "vector_quantization_hidden_dimension": 32,
    "num_hidden_layers": 2, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
    "upsample_groups": 32, "sliding_window": 16, "layer_scale_initial_scale": 1.0,
}


def tiny_mimi_config(codebook_size: int = 64, num_quantizers: int = 8, **overrides: Any) -> dict[str, Any]:
    """``MimiConfig`` keyword arguments of a tiny Mimi (``TINY_MIMI``) with ``codebook_size`` codes (a power of
    two; CSM needs it above its audio vocabulary) in each of ``num_quantizers`` codebooks, ``overrides`` last.
    Pass it as ``CsmConfig(codec_config=...)``, ``MoshiConfig(audio_encoder_config=...)`` or ``MimiConfig(**...)``."""
    return {**TINY_MIMI, "codebook_size": codebook_size, "num_quantizers": num_quantizers, **overrides}


@torch.no_grad()
def fill_codebooks(model: torch.nn.Module, generator: torch.Generator) -> int:
    """Give every Mimi codebook in ``model`` (a ``MimiModel``, or a CSM or Moshi model holding one) standard normal
    centroids drawn from ``generator`` (CPU), usage 1, and drop the centroids each codebook caches; return how many
    codebooks were filled. Call it after building the model and before saving it."""
    from transformers.models.mimi.modeling_mimi import MimiEuclideanCodebook

    filled = 0
    for module in model.modules():
        if isinstance(module, MimiEuclideanCodebook):
            centroids = torch.randn(tuple(module.embed_sum.shape), generator=generator)
            module.embed_sum.copy_(centroids.to(module.embed_sum.device, module.embed_sum.dtype))
            module.cluster_usage.fill_(1.0)
            module._embed = None  # the lazily computed centroids (embed_sum / usage) of before
            filled += 1
    return filled


def write_tiny_checkpoint(directory: str | Path, seed: int = 0, **config: Any) -> Path:
    """Write a standalone tiny Mimi checkpoint (``config.json`` with ``model_type`` mimi, ``model.safetensors`` in
    kyutai/mimi's tensor names) into ``directory`` (created) and return its path; ``config`` goes to
    ``tiny_mimi_config``. The same seed writes the same weights."""
    from transformers import MimiConfig, MimiModel

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = MimiModel(MimiConfig(**tiny_mimi_config(**config))).eval()
    fill_codebooks(model, torch.Generator().manual_seed(seed + 1))
    model.save_pretrained(directory)
    return directory

"""Attention that reads a ``PagedKVCache``'s blocks itself: the seam where a paged GPU kernel (FlashInfer's, flash-
attention's paged varlen, torch's varlen attention over block tables) plugs in by name.

A stage whose option ``paged_attention`` names a kernel gives its decoder the transformers attention function
``omnipipe_paged`` (registered here). The cache's ``update`` then stores the step's new keys and values and hands
the attention the layer's whole pools instead of each row's gathered history, and the step's ``PagedStep`` (block
tables, lengths, the slots each row reads, its first query position) comes with the decoder's keyword arguments
(``PagedKVCache.step_inputs``). The kernel named computes the attention from them:

    register_kernel("my-kernel", kernel)   # kernel(query, key_pool, value_pool, step, mask, scaling) -> output

``reference`` is the definition every kernel must match: each row's history gathered through its slots and
torch's scaled-dot-product attention under the step's mask (what the default, dense path computes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

ATTENTION_FUNCTION = "omnipipe_paged"  # the name transformers knows the function by


@dataclass(frozen=True)
class PagedStep:
    """One forward's view of the cache, on its device: ``block_tables`` [rows, blocks] (each row's blocks in
    order, padded with -1), ``lengths`` [rows] (each row's history once the step's tokens are in), ``starts``
    [rows] (its first query's position), ``slots`` [rows, width] (the pool row each history position reads, the
    padding's row past a row's end) and ``block_tokens``."""

    block_tables: torch.Tensor
    lengths: torch.Tensor
    starts: torch.Tensor
    slots: torch.Tensor
    block_tokens: int


# (query [rows, heads, query, dim], key pool, value pool [slots, kv heads, dim], step, additive mask [rows, 1,
# query, width] or None, scaling) -> attention output [rows, query, heads, dim]
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PagedStep, "torch.Tensor | None", float], torch.Tensor]


def reference_kernel(query: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor, step: PagedStep,
                     mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """Each row's history gathered through its slots, then scaled-dot-product attention under the mask."""
    keys, values = key_pool[step.slots].transpose(1, 2), value_pool[step.slots].transpose(1, 2)
    out = F.scaled_dot_product_attention(query, keys, values.to(query.dtype), attn_mask=mask, scale=scaling,
                                         enable_gqa=True)
    return out.transpose(1, 2).contiguous()


KERNELS: dict[str, Kernel] = {"reference": reference_kernel}


def register_kernel(name: str, kernel: Kernel) -> None:
    """Make ``kernel`` what a stage's ``paged_attention: NAME`` runs."""
    if not name or not isinstance(name, str):
        raise ValueError(f"a paged attention kernel needs a name, got {name!r}")
    KERNELS[name] = kernel


def kernel_named(name: str) -> Kernel:
    """The kernel called ``name``; a ValueError naming the choices otherwise."""
    if name not in KERNELS:
        raise ValueError(f"paged_attention: no kernel {name!r}; registered: {', '.join(sorted(KERNELS))}")
    return KERNELS[name]


def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention function ``omnipipe_paged``: ``key`` and ``value`` are the layer's pools (what
    ``PagedKVCache.update`` returns in paged mode); ``kwargs["paged_step"]`` and ``kwargs["paged_kernel"]`` come
    with the decoder's inputs."""
    step: PagedStep | None = kwargs.get("paged_step")
    if step is None:
        raise RuntimeError("omnipipe_paged attention needs the step's paged_step (PagedKVCache.step_inputs)")
    kernel = kernel_named(kwargs.get("paged_kernel", "reference"))
    scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    return kernel(query, key, value, step, attention_mask, scale), None


def use_paged_attention(model: Any) -> None:
    """Have ``model``'s attention layers (a transformers ``PreTrainedModel``) call ``omnipipe_paged`` (registered
    with transformers on first use)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_FUNCTION, paged_attention_forward)
    model.set_attn_implementation(ATTENTION_FUNCTION)

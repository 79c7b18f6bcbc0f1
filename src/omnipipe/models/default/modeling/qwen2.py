"""A compact Qwen2 text decoder in plain torch (the KV pool and batching are ``decoder.py``'s).

Qwen2 (and the Qwen2.5 instruct models built on it): pre-norm RMSNorm layers, grouped-query attention with biased
q/k/v projections and rotary positions, a SiLU-gated MLP, full attention in every layer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from omnipipe.models.default.modeling.decoder import CachedDecoder, ShardedCheckpoint, rope_angles, rotate_half
from omnipipe.models.default.modeling.quantized import Weight, project

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Qwen2Config:
    """The subset of a Qwen2 ``config.json`` the decoder needs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Qwen2Config:
        activation = raw.get("hidden_act", "silu")
        if activation != "silu":
            raise ValueError(f"hidden_act {activation!r} is not supported")
        if raw.get("use_sliding_window"):
            raise ValueError("use_sliding_window is not supported")
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope type {rope_type!r} is not supported")
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads", heads)),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10_000.0))),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32_768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        )


@dataclass
class _LayerWeights:
    """One layer's weights; with tensor parallelism the rank's shard (heads, intermediate: the local counts)."""

    qkv: Weight  # [(heads + 2 * kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None  # None once folded into an int8 qkv
    o: Weight  # [hidden, heads * head_dim]
    gate_up: Weight  # [2 * intermediate, hidden]
    down: Weight  # [hidden, intermediate]
    input_norm: torch.Tensor  # float32
    post_attn_norm: torch.Tensor


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x_float = x.float()
    normed = x_float * torch.rsqrt(x_float.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * normed).type_as(x)


class Qwen2Thinker(CachedDecoder):
    """Qwen2 decoder over a converted checkpoint directory (config.json + model.safetensors + tokenizer);
    tensor-parallel with ``rank``/``world_size``/``group`` (``CachedDecoder``: sharded attention and MLP,
    replicated embeddings, norms and lm_head)."""

    _projections = (("qkv", "qkv_bias"), ("o", None), ("gate_up", None), ("down", None))

    def _read_config(self, raw: dict[str, Any]) -> None:
        cfg = self.config = Qwen2Config.from_dict(raw)
        self.vocab_size, self.max_positions = cfg.vocab_size, cfg.max_position_embeddings
        self.sliding_window = None
        head_range = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64, device=self.device).float() / cfg.head_dim
        self._inv_freq = 1.0 / (cfg.rope_theta**head_range)
        self._scale = cfg.head_dim**-0.5
        self._shard_attention(cfg.num_heads, cfg.num_kv_heads)

    def _load_weights(self, path: Path) -> None:
        cfg = self.config
        dim = cfg.head_dim
        q_rows = (self._head_start * dim, (self._head_start + self._heads) * dim)
        kv_rows = (self._kv_head_start * dim, (self._kv_head_start + self._kv_heads) * dim)
        inner = self._shard(cfg.intermediate_size)
        with ShardedCheckpoint(path, self.dtype, self.device) as weights:
            self._embed = weights.full("model.embed_tokens.weight")
            self._final_norm = weights.full("model.norm.weight", torch.float32)
            if "lm_head.weight" in weights:
                self._lm_head = weights.full("lm_head.weight")
            elif cfg.tie_word_embeddings:
                self._lm_head = self._embed
            else:
                raise ValueError(f"{path}: lm_head.weight is missing and the embeddings are not tied")
            self._layers: list[_LayerWeights] = []
            for i in range(cfg.num_layers):
                p = f"model.layers.{i}."
                attn = [(f"{p}self_attn.{n}_proj", rows) for n, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))]
                self._layers.append(
                    _LayerWeights(
                        qkv=torch.cat([weights.rows(name + ".weight", *rows) for name, rows in attn]),
                        qkv_bias=torch.cat([weights.rows(name + ".bias", *rows) for name, rows in attn]),
                        o=weights.columns(p + "self_attn.o_proj.weight", *q_rows),
                        gate_up=torch.cat([weights.rows(p + "mlp.gate_proj.weight", *inner),
                                           weights.rows(p + "mlp.up_proj.weight", *inner)]),
                        down=weights.columns(p + "mlp.down_proj.weight", *inner),
                        input_norm=weights.full(p + "input_layernorm.weight", torch.float32),
                        post_attn_norm=weights.full(p + "post_attention_layernorm.weight", torch.float32),
                    )
                )
            if weights.unused():
                logger.warning("Ignoring unexpected tensors: %s", weights.unused()[:5])

    def kv_shape(self) -> tuple[int, int, int]:
        return self.config.num_layers, self._kv_heads, self.config.head_dim

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = _rms_norm(hidden, self._final_norm, self.config.rms_norm_eps)
        return project(hidden, self._lm_head).float()

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        batch, seq = ids.shape
        hidden = F.embedding(ids, self._embed)
        cos, sin = rope_angles(positions, self._inv_freq, self.dtype)
        heads, kv_heads = self._heads, self._kv_heads  # this rank's
        q_size, kv_size = heads * cfg.head_dim, kv_heads * cfg.head_dim
        causal = self.step_masks(positions)[1]
        for index, layer in enumerate(self._layers):
            residual = hidden
            x = _rms_norm(hidden, layer.input_norm, cfg.rms_norm_eps)
            q, k, v = project(x, layer.qkv, layer.qkv_bias).split([q_size, kv_size, kv_size], dim=-1)
            q = q.view(batch, seq, heads, cfg.head_dim).transpose(1, 2)
            k = k.view(batch, seq, kv_heads, cfg.head_dim).transpose(1, 2)
            v = v.view(batch, seq, kv_heads, cfg.head_dim).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            keys, values = self.kv.update(k, v, index)
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=causal, scale=self._scale,
                                                  enable_gqa=True)
            hidden = residual + self._reduce(project(attn.transpose(1, 2).reshape(batch, seq, q_size), layer.o))
            x = _rms_norm(hidden, layer.post_attn_norm, cfg.rms_norm_eps)
            gate, up = project(x, layer.gate_up).chunk(2, dim=-1)
            hidden = hidden + self._reduce(project(F.silu(gate) * up, layer.down))
        return hidden

"""A compact Gemma 3 text decoder in plain torch (the KV pool and batching are ``decoder.py``'s).

Sliding-window layers attend to the last ``sliding_window`` positions only: their mask is built from the step's
positions (``CachedDecoder.step_masks``); their keys and values are kept in the pool like every layer's.
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
class GemmaConfig:
    """The subset of a Gemma 3 ``config.json`` the decoder needs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    query_pre_attn_scalar: float
    sliding_window: int
    layer_is_sliding: tuple[bool, ...]
    rope_theta_global: float
    rope_theta_local: float
    max_position_embeddings: int
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> GemmaConfig:
        activation = raw.get("hidden_activation", "gelu_pytorch_tanh")
        if activation != "gelu_pytorch_tanh":
            raise ValueError(f"hidden_activation {activation!r} is not supported")
        num_layers = int(raw["num_hidden_layers"])
        layer_types = raw.get("layer_types")
        if layer_types is None:
            pattern = int(raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", 6)))
            layer_types = [
                "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)
            ]
        rope = raw.get("rope_parameters") or {}
        rope_global = rope.get("full_attention", {}).get("rope_theta", raw.get("rope_theta", 1_000_000.0))
        rope_local = rope.get("sliding_attention", {}).get("rope_theta", raw.get("rope_local_base_freq", 10_000.0))
        eos = raw.get("eos_token_id", [])
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_heads=int(raw["num_attention_heads"]),
            num_kv_heads=int(raw["num_key_value_heads"]),
            head_dim=int(raw["head_dim"]),
            rms_norm_eps=float(raw["rms_norm_eps"]),
            query_pre_attn_scalar=float(raw["query_pre_attn_scalar"]),
            sliding_window=int(raw["sliding_window"]),
            layer_is_sliding=tuple(kind == "sliding_attention" for kind in layer_types),
            rope_theta_global=float(rope_global),
            rope_theta_local=float(rope_local),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32_768)),
            attn_logit_softcapping=raw.get("attn_logit_softcapping"),
            final_logit_softcapping=raw.get("final_logit_softcapping"),
            eos_token_ids=tuple(eos if isinstance(eos, list) else [eos]),
        )


@dataclass
class _LayerWeights:
    """One layer's weights; with tensor parallelism the rank's shard (heads, intermediate: the local counts)."""

    qkv: Weight  # [(heads + 2 * kv_heads) * head_dim, hidden]
    o: Weight  # [hidden, heads * head_dim]
    gate_up: Weight  # [2 * intermediate, hidden]
    down: Weight  # [hidden, intermediate]
    q_norm: torch.Tensor  # [head_dim], shared by all heads; norm weights are stored as (1 + w), float32
    k_norm: torch.Tensor
    input_norm: torch.Tensor
    post_attn_norm: torch.Tensor
    pre_ffn_norm: torch.Tensor
    post_ffn_norm: torch.Tensor


def _rms_norm(x: torch.Tensor, weight_plus_one: torch.Tensor, eps: float) -> torch.Tensor:
    x_float = x.float()
    normed = x_float * torch.rsqrt(x_float.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight_plus_one).type_as(x)


class GemmaThinker(CachedDecoder):
    """Gemma 3 decoder over a converted checkpoint directory (config.json + model.safetensors + tokenizer);
    tensor-parallel with ``rank``/``world_size``/``group`` (``CachedDecoder``: sharded attention and MLP,
    replicated embeddings, norms and lm_head; a single KV head is replicated on every rank)."""

    _projections = (("qkv", None), ("o", None), ("gate_up", None), ("down", None))

    def _read_config(self, raw: dict[str, Any]) -> None:
        cfg = self.config = GemmaConfig.from_dict(raw)
        self.vocab_size, self.max_positions = cfg.vocab_size, cfg.max_position_embeddings
        self.sliding_window = cfg.sliding_window
        head_range = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64, device=self.device).float() / cfg.head_dim
        self._inv_freq_local = 1.0 / (cfg.rope_theta_local**head_range)
        self._inv_freq_global = 1.0 / (cfg.rope_theta_global**head_range)
        self._scale = cfg.query_pre_attn_scalar**-0.5
        self._shard_attention(cfg.num_heads, cfg.num_kv_heads)

    def _load_weights(self, path: Path) -> None:
        cfg = self.config
        dim = cfg.head_dim
        q_rows = (self._head_start * dim, (self._head_start + self._heads) * dim)
        kv_rows = (self._kv_head_start * dim, (self._kv_head_start + self._kv_heads) * dim)
        inner = self._shard(cfg.intermediate_size)
        with ShardedCheckpoint(path, self.dtype, self.device) as weights:

            def norm(name: str) -> torch.Tensor:
                return 1.0 + weights.full(name, torch.float32)

            self._embed = weights.full("model.embed_tokens.weight")
            self._embed_scale = torch.tensor(cfg.hidden_size**0.5, dtype=self.dtype, device=self.device)
            self._final_norm = norm("model.norm.weight")
            self._lm_head = weights.full("lm_head.weight") if "lm_head.weight" in weights else self._embed
            self._layers: list[_LayerWeights] = []
            for i in range(len(cfg.layer_is_sliding)):
                p = f"model.layers.{i}."
                self._layers.append(
                    _LayerWeights(
                        qkv=torch.cat([weights.rows(f"{p}self_attn.{n}_proj.weight", *rows)
                                       for n, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))]),
                        o=weights.columns(p + "self_attn.o_proj.weight", *q_rows),
                        gate_up=torch.cat([weights.rows(p + "mlp.gate_proj.weight", *inner),
                                           weights.rows(p + "mlp.up_proj.weight", *inner)]),
                        down=weights.columns(p + "mlp.down_proj.weight", *inner),
                        q_norm=norm(p + "self_attn.q_norm.weight"),
                        k_norm=norm(p + "self_attn.k_norm.weight"),
                        input_norm=norm(p + "input_layernorm.weight"),
                        post_attn_norm=norm(p + "post_attention_layernorm.weight"),
                        pre_ffn_norm=norm(p + "pre_feedforward_layernorm.weight"),
                        post_ffn_norm=norm(p + "post_feedforward_layernorm.weight"),
                    )
                )
            if weights.unused():
                logger.warning("Ignoring unexpected tensors: %s", weights.unused()[:5])

    def kv_shape(self) -> tuple[int, int, int]:
        return len(self.config.layer_is_sliding), self._kv_heads, self.config.head_dim

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = _rms_norm(hidden, self._final_norm, self.config.rms_norm_eps)
        logits = project(hidden, self._lm_head).float()
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run all layers on ids [rows, seq]; a sliding-window layer's mask keeps to its window."""
        cfg = self.config
        batch, seq = ids.shape
        hidden = F.embedding(ids, self._embed) * self._embed_scale
        rope = (rope_angles(positions, self._inv_freq_local, self.dtype),
                rope_angles(positions, self._inv_freq_global, self.dtype))
        heads, kv_heads = self._heads, self._kv_heads  # this rank's
        q_size, kv_size = heads * cfg.head_dim, kv_heads * cfg.head_dim
        masks = self.step_masks(positions)
        for index, layer in enumerate(self._layers):
            sliding = cfg.layer_is_sliding[index]
            cos, sin = rope[0] if sliding else rope[1]
            residual = hidden
            x = _rms_norm(hidden, layer.input_norm, cfg.rms_norm_eps)
            q, k, v = project(x, layer.qkv).split([q_size, kv_size, kv_size], dim=-1)
            q = q.view(batch, seq, heads, cfg.head_dim).transpose(1, 2)
            k = k.view(batch, seq, kv_heads, cfg.head_dim).transpose(1, 2)
            v = v.view(batch, seq, kv_heads, cfg.head_dim).transpose(1, 2)
            q = _rms_norm(q, layer.q_norm, cfg.rms_norm_eps)
            k = _rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            keys, values = self.kv.update(k, v, index)
            attn = self._attention(q, keys, values, masks[0] if sliding else masks[1])
            attn = attn.transpose(1, 2).reshape(batch, seq, q_size)
            x = self._reduce(project(attn, layer.o))  # sum the ranks' heads before the norm
            hidden = residual + _rms_norm(x, layer.post_attn_norm, cfg.rms_norm_eps)
            x = _rms_norm(hidden, layer.pre_ffn_norm, cfg.rms_norm_eps)
            gate, up = project(x, layer.gate_up).chunk(2, dim=-1)
            x = self._reduce(project(F.gelu(gate, approximate="tanh") * up, layer.down))
            hidden = hidden + _rms_norm(x, layer.post_ffn_norm, cfg.rms_norm_eps)
        return hidden

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        cap = self.config.attn_logit_softcapping
        if cap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self._scale, enable_gqa=True)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = torch.tanh((q @ k.transpose(-1, -2)) * self._scale / cap) * cap
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v

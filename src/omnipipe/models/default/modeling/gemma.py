"""A compact Gemma 3 text decoder in plain torch with a per-request KV cache.

Requests are prefilled one at a time and then decoded together: ``decode`` runs
one batched forward for requests sitting at different positions (caches padded to
the longest and masked). Sliding-window layers keep only the last ``sliding_window``
keys/values, so their memory stays bounded. Not thread-safe: drive it from one thread.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

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
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    o: torch.Tensor
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor
    q_norm: torch.Tensor  # norm weights are stored as (1 + w), float32
    k_norm: torch.Tensor
    input_norm: torch.Tensor
    post_attn_norm: torch.Tensor
    pre_ffn_norm: torch.Tensor
    post_ffn_norm: torch.Tensor


class _LayerCache:
    """Growable K/V store for one layer of one request; optionally keeps only the newest entries."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, keep_last: int | None) -> None:
        self.keep_last = keep_last
        self.k = torch.empty(kv_heads, 64, head_dim, dtype=dtype)
        self.v = torch.empty_like(self.k)
        self.start = 0
        self.end = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append ``k``/``v`` of shape [kv_heads, n, head_dim]."""
        n = k.shape[1]
        if self.end + n > self.k.shape[1]:
            if self.keep_last is not None:  # drop entries that can no longer be attended to
                self.start = max(self.start, self.end - self.keep_last)
            size = self.end - self.start
            capacity = max(self.k.shape[1], 2 * (size + n))
            if self.keep_last is not None:
                capacity = min(capacity, 2 * (self.keep_last + n))
            k_new = torch.empty(self.k.shape[0], capacity, self.k.shape[2], dtype=self.k.dtype)
            v_new = torch.empty_like(k_new)
            k_new[:, :size] = self.k[:, self.start : self.end]
            v_new[:, :size] = self.v[:, self.start : self.end]
            self.k, self.v, self.start, self.end = k_new, v_new, 0, size
        self.k[:, self.end : self.end + n] = k
        self.v[:, self.end : self.end + n] = v
        self.end += n

    def view(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The entries attention may see: all, or the newest ``keep_last``."""
        start = self.start if self.keep_last is None else max(self.start, self.end - self.keep_last)
        return self.k[:, start : self.end], self.v[:, start : self.end]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def mark(self) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """A cheap checkpoint (no copy): ``append`` writes only past ``end`` or into new tensors, so the entries
        a mark covers stay intact and ``reset`` brings the cache back to them."""
        return self.k, self.v, self.start, self.end

    def reset(self, mark: tuple[torch.Tensor, torch.Tensor, int, int]) -> None:
        self.k, self.v, self.start, self.end = mark

    def clone(self) -> "_LayerCache":
        copy = _LayerCache.__new__(_LayerCache)
        copy.keep_last, copy.start, copy.end = self.keep_last, self.start, self.end
        copy.k, copy.v = self.k.clone(), self.v.clone()
        return copy


@dataclass
class _Request:
    caches: list[_LayerCache]
    num_tokens: int = 0


def _rms_norm(x: torch.Tensor, weight_plus_one: torch.Tensor, eps: float) -> torch.Tensor:
    x_float = x.float()
    normed = x_float * torch.rsqrt(x_float.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight_plus_one).type_as(x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class GemmaThinker:
    """Gemma 3 decoder over a converted checkpoint directory (config.json + model.safetensors + tokenizer)."""

    def __init__(self, model_dir: Path, num_threads: int | None = None, dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoTokenizer

        started_s = time.perf_counter()
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        model_dir = Path(model_dir)
        self.model_dir = model_dir
        self.dtype = dtype
        self.config = GemmaConfig.from_dict(json.loads((model_dir / "config.json").read_text()))
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        eos = set(self.config.eos_token_ids)
        generation_config = model_dir / "generation_config.json"
        if generation_config.is_file():
            extra = json.loads(generation_config.read_text()).get("eos_token_id", [])
            eos.update(extra if isinstance(extra, list) else [extra])
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        self._load_weights(model_dir / "model.safetensors")
        cfg = self.config
        head_range = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim
        self._inv_freq_local = 1.0 / (cfg.rope_theta_local**head_range)
        self._inv_freq_global = 1.0 / (cfg.rope_theta_global**head_range)
        self._scale = cfg.query_pre_attn_scalar**-0.5
        self._requests: dict[str, _Request] = {}
        logger.info("Loaded %s in %.1f s (%s, %d threads)", model_dir, time.perf_counter() - started_s,
                    dtype, torch.get_num_threads())

    def _load_weights(self, path: Path) -> None:
        state = load_file(str(path))
        cfg = self.config

        def take(name: str) -> torch.Tensor:
            return state.pop(name).to(self.dtype).contiguous()

        def norm(name: str) -> torch.Tensor:
            return 1.0 + state.pop(name).float()

        self._embed = take("model.embed_tokens.weight")
        self._embed_scale = torch.tensor(cfg.hidden_size**0.5, dtype=self.dtype)
        self._final_norm = norm("model.norm.weight")
        self._lm_head = take("lm_head.weight") if "lm_head.weight" in state else self._embed
        self._layers: list[_LayerWeights] = []
        for i in range(len(cfg.layer_is_sliding)):
            p = f"model.layers.{i}."
            self._layers.append(
                _LayerWeights(
                    qkv=torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"]),
                    o=take(p + "self_attn.o_proj.weight"),
                    gate_up=torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]),
                    down=take(p + "mlp.down_proj.weight"),
                    q_norm=norm(p + "self_attn.q_norm.weight"),
                    k_norm=norm(p + "self_attn.k_norm.weight"),
                    input_norm=norm(p + "input_layernorm.weight"),
                    post_attn_norm=norm(p + "post_attention_layernorm.weight"),
                    pre_ffn_norm=norm(p + "pre_feedforward_layernorm.weight"),
                    post_ffn_norm=norm(p + "post_feedforward_layernorm.weight"),
                )
            )
        if state:
            logger.warning("Ignoring unexpected tensors: %s", sorted(state)[:5])

    # -- request bookkeeping -------------------------------------------------

    def active_requests(self) -> list[str]:
        """Ids of requests that currently hold a KV cache."""
        return list(self._requests)

    def num_cached_tokens(self, request_id: str) -> int:
        """Tokens processed so far for a request (its next position)."""
        return self._requests[request_id].num_tokens

    def kv_cache_bytes(self) -> int:
        """Bytes held by all request KV caches."""
        return sum(c.nbytes for r in self._requests.values() for c in r.caches)

    def checkpoint(self, request_id: str) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor, int, int]]]:
        """A cheap mark of a request's cache (no copy) that ``rewind`` returns to, undoing later decode steps
        (e.g. one that failed half-way through a batch)."""
        request = self._requests[request_id]
        return request.num_tokens, [cache.mark() for cache in request.caches]

    def rewind(self, request_id: str, checkpoint: tuple[int, list[tuple[torch.Tensor, torch.Tensor, int, int]]]) -> None:
        request = self._requests[request_id]
        request.num_tokens, marks = checkpoint
        for cache, mark in zip(request.caches, marks):
            cache.reset(mark)

    def free(self, request_id: str) -> bool:
        """Release a request's KV cache; returns False if it held none."""
        return self._requests.pop(request_id, None) is not None

    # -- forward passes ------------------------------------------------------

    @torch.inference_mode()
    def set_shared_prefix(self, token_ids: list[int]) -> None:
        """Compute once the KV cache of a prefix many prompts start with (a few-shot preamble); ``prefill`` then
        copies it and runs only the rest of such a prompt. Prefixes longer than the sliding window are ignored."""
        self._shared_prefix = None
        if not token_ids or len(token_ids) >= self.config.sliding_window:
            return
        self.prefill("\0shared-prefix", token_ids)
        cached = self._requests.pop("\0shared-prefix")
        self._shared_prefix = (tuple(token_ids), cached.caches)

    def _prefix_for(self, token_ids: list[int]) -> tuple[tuple[int, ...], list[_LayerCache]] | None:
        prefix = getattr(self, "_shared_prefix", None)
        if prefix is None or not len(prefix[0]) < len(token_ids) <= self.config.sliding_window:
            return None
        return prefix if tuple(token_ids[: len(prefix[0])]) == prefix[0] else None

    @torch.inference_mode()
    def prefill(self, request_id: str, token_ids: list[int]) -> torch.Tensor:
        """Run the prompt of a new request, create its cache, return float32 logits [vocab] of the last position."""
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already active; free() it first")
        if not token_ids:
            raise ValueError("token_ids must not be empty")
        self._check_tokens(token_ids, len(token_ids))
        cfg = self.config
        num_tokens = len(token_ids)
        prefix = self._prefix_for(token_ids)
        if prefix is not None:  # reuse the shared prefix's cache; run only the new tokens against it
            start = len(prefix[0])
            caches = [cache.clone() for cache in prefix[1]]
        else:
            start = 0
            caches = [
                _LayerCache(cfg.num_kv_heads, cfg.head_dim, self.dtype, cfg.sliding_window if sliding else None)
                for sliding in cfg.layer_is_sliding
            ]
        positions = torch.arange(start, num_tokens).unsqueeze(0)
        distance = positions.T - torch.arange(num_tokens).unsqueeze(0)  # [query, key]: how far back the key is
        causal = distance >= 0
        local = causal & (distance < cfg.sliding_window)
        masks = (local[None, None], causal[None, None])
        ids = torch.tensor([token_ids[start:]], dtype=torch.long)
        hidden = self._forward(ids, positions, [caches], masks, padded=False, extend=prefix is not None)
        self._requests[request_id] = _Request(caches=caches, num_tokens=num_tokens)
        return self._logits(hidden[0, -1])

    @torch.inference_mode()
    def decode(self, request_ids: list[str], token_ids: list[int]) -> torch.Tensor:
        """Feed one token per active request in one batched forward; returns float32 logits [batch, vocab]."""
        if len(request_ids) != len(token_ids):
            raise ValueError("request_ids and token_ids must have the same length")
        if not request_ids:
            raise ValueError("request_ids must not be empty")
        if len(set(request_ids)) != len(request_ids):
            raise ValueError("request_ids must be unique")
        missing = [rid for rid in request_ids if rid not in self._requests]
        if missing:
            raise KeyError(f"unknown request ids (prefill first): {missing}")
        requests = [self._requests[rid] for rid in request_ids]
        self._check_tokens(token_ids, max(r.num_tokens for r in requests) + 1)
        positions = torch.tensor([[r.num_tokens] for r in requests], dtype=torch.long)
        ids = torch.tensor(token_ids, dtype=torch.long).unsqueeze(1)
        hidden = self._forward(ids, positions, [r.caches for r in requests], None, padded=True)
        for request in requests:
            request.num_tokens += 1
        return self._logits(hidden[:, 0])

    def _check_tokens(self, token_ids: list[int], context_tokens: int) -> None:
        if context_tokens > self.config.max_position_embeddings:
            raise ValueError(f"context of {context_tokens} tokens exceeds {self.config.max_position_embeddings}")
        if min(token_ids) < 0 or max(token_ids) >= self.config.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size})")

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = _rms_norm(hidden, self._final_norm, self.config.rms_norm_eps)
        logits = F.linear(hidden, self._lm_head).float()
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _rope(self, positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * inv_freq  # [batch, seq, head_dim / 2]
        angles = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)  # [batch, 1, seq, head_dim]
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        caches: list[list[_LayerCache]],
        masks: tuple[torch.Tensor, torch.Tensor] | None,
        padded: bool,
        extend: bool = False,
    ) -> torch.Tensor:
        """Run all layers on ids [batch, seq]; prefill passes masks, decode (seq 1) attends to padded caches."""
        cfg = self.config
        batch, seq = ids.shape
        hidden = F.embedding(ids, self._embed) * self._embed_scale
        rope = (self._rope(positions, self._inv_freq_local), self._rope(positions, self._inv_freq_global))
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        for index, layer in enumerate(self._layers):
            sliding = cfg.layer_is_sliding[index]
            cos, sin = rope[0] if sliding else rope[1]
            residual = hidden
            x = _rms_norm(hidden, layer.input_norm, cfg.rms_norm_eps)
            q, k, v = F.linear(x, layer.qkv).split([q_size, kv_size, kv_size], dim=-1)
            q = q.view(batch, seq, cfg.num_heads, cfg.head_dim).transpose(1, 2)
            k = k.view(batch, seq, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
            v = v.view(batch, seq, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
            q = _rms_norm(q, layer.q_norm, cfg.rms_norm_eps)
            k = _rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            if padded:
                keys, values, mask = self._gather_cache([c[index] for c in caches], k, v)
            elif extend:  # one request whose cache already holds earlier tokens (all within the window)
                cache = caches[0][index]
                cache.append(k[0], v[0])
                key, value = cache.view()
                keys, values, mask = key[None], value[None], masks[0] if sliding else masks[1]  # type: ignore[index]
            else:
                for b, request_caches in enumerate(caches):
                    cache = request_caches[index]
                    keep = cache.keep_last
                    cache.append(k[b, :, -keep:] if keep else k[b], v[b, :, -keep:] if keep else v[b])
                keys, values, mask = k, v, masks[0] if sliding else masks[1]  # type: ignore[index]
            attn = self._attention(q, keys, values, mask)
            attn = attn.transpose(1, 2).reshape(batch, seq, q_size)
            hidden = residual + _rms_norm(F.linear(attn, layer.o), layer.post_attn_norm, cfg.rms_norm_eps)
            x = _rms_norm(hidden, layer.pre_ffn_norm, cfg.rms_norm_eps)
            gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)
            x = F.linear(F.gelu(gate, approximate="tanh") * up, layer.down)
            hidden = hidden + _rms_norm(x, layer.post_ffn_norm, cfg.rms_norm_eps)
        return hidden

    def _gather_cache(
        self, layer_caches: list[_LayerCache], k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Append each request's new K/V, then stack the visible caches right-padded with a key mask."""
        views = []
        for b, cache in enumerate(layer_caches):
            cache.append(k[b], v[b])
            views.append(cache.view())
        if len(views) == 1:
            return views[0][0][None], views[0][1][None], None
        lengths = torch.tensor([key.shape[1] for key, _ in views])
        longest = int(lengths.max())
        keys = k.new_empty(len(views), k.shape[1], longest, k.shape[3])
        values = torch.empty_like(keys)
        for b, (key, value) in enumerate(views):
            length = key.shape[1]
            keys[b, :, :length] = key
            values[b, :, :length] = value
            keys[b, :, length:] = 0  # padding must stay finite: masked weights are 0, and 0 * nan = nan
            values[b, :, length:] = 0
        mask = (torch.arange(longest)[None, :] < lengths[:, None])[:, None, None, :]
        return keys, values, mask

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        cap = self.config.attn_logit_softcapping
        if cap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self._scale, enable_gqa=True)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = torch.tanh((q @ k.transpose(-1, -2)) * self._scale / cap) * cap
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v

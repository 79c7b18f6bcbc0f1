"""What the family's torch decoders share: a per-request KV cache, continuous-batching bookkeeping and the
prefill / batched-decode entry points the thinker runner drives.

Requests are prefilled one at a time and then decoded together: ``decode`` runs one batched forward for requests
sitting at different positions (caches padded to the longest and masked). A model (``GemmaThinker``,
``Qwen2Thinker``) supplies its config, weights, layers and logits. Not thread-safe: drive it from one thread.

Tensor parallelism (Megatron style): ``world_size`` processes, each constructed with its ``rank`` and a
``torch.distributed`` process group, hold one shard each and run the same calls in the same order. Rank r keeps a
contiguous slice of the query heads with their q/k/v rows (and biases), and the KV heads those queries use: split
across ranks when ``num_kv_heads`` divides by ``world_size``, otherwise each rank keeps (a replica of) the one its
queries share. The o projection is row-parallel (the input columns of the rank's heads), the MLP's gate/up are
column-parallel (a slice of the intermediate dimension) and its down projection row-parallel; the partial outputs
of o and down are summed with one all-reduce each, so every rank ends a layer with the same hidden states.
Embeddings and norms are replicated; the lm_head is split by vocabulary (each rank scores its slice of the tokens)
and rank 0 gathers the slices: only rank 0 gets logits, the others get None. Every rank must pass the same
``logits`` to ``prefill``/``decode`` (``False`` skips the lm_head and the gather everywhere). Each rank's KV caches
hold only its own KV heads. With ``world_size`` 1 there is no communication at all.

``device`` (the stage's, e.g. ``cuda:1``): the weights are read from the checkpoint straight onto it, and the KV
caches and every step's tensors live there; logits come back on it. int8 weights (``int8``, ``int8-split``) are CPU
only (fbgemm).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnipipe.models.default.modeling.quantized import INT8_FORMATS, Int8Linear, Int8SplitLinear, check_weight_format

logger = logging.getLogger(__name__)

_SHARED_PREFIX_ID = "\0shared-prefix"


class LayerCache:
    """Growable K/V store for one layer of one request; optionally keeps only the newest entries."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, keep_last: int | None,
                 device: torch.device | str = "cpu") -> None:
        self.keep_last = keep_last
        self.k = torch.empty(kv_heads, 64, head_dim, dtype=dtype, device=device)
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
            k_new = self.k.new_empty(self.k.shape[0], capacity, self.k.shape[2])
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

    def copy_first(self, num_entries: int) -> LayerCache:
        """A new cache holding a copy of the first ``num_entries`` (of a cache that has dropped none)."""
        if self.start != 0 or not 0 < num_entries <= self.end:
            raise ValueError(f"cannot copy {num_entries} entries of a cache of [{self.start}, {self.end})")
        copy = LayerCache(self.k.shape[0], self.k.shape[2], self.k.dtype, self.keep_last, self.k.device)
        copy.append(self.k[:, :num_entries], self.v[:, :num_entries])
        return copy

    def clone(self) -> LayerCache:
        copy = LayerCache.__new__(LayerCache)
        copy.keep_last, copy.start, copy.end = self.keep_last, self.start, self.end
        copy.k, copy.v = self.k.clone(), self.v.clone()
        return copy


@dataclass
class _Request:
    caches: list[LayerCache]
    num_tokens: int = 0


# a request's KV caches (one per layer) holding the first ``num_tokens`` of a prompt, for ``prefill`` to go on from
KVPrefix = tuple[list[LayerCache], int]
# a prefill's attention masks [1, 1, query, key]: (within the sliding window, causal)
PrefillMasks = tuple[torch.Tensor, torch.Tensor]


class CachedDecoder:
    """A decoder over a converted checkpoint directory (config.json + model.safetensors + tokenizer) with one KV
    cache per request. Subclasses set ``vocab_size``, ``max_positions``, ``sliding_window`` (None: full attention
    everywhere) and implement ``_read_config`` (which calls ``_shard_attention``), ``_load_weights`` (keeping this
    rank's slices, see ``ShardedCheckpoint``), ``_new_caches``, ``_forward`` (over the local ``_heads`` and
    ``_kv_heads``, passing the outputs of o and down through ``_reduce``) and ``_logits``.

    ``rank``, ``world_size`` and ``group`` (a ``torch.distributed`` process group; None: the default one) shard the
    model for tensor parallelism (see the module docstring); a ``world_size`` that does not divide the heads, or
    that would split a rank's queries across KV groups unevenly, is refused with a ValueError."""

    vocab_size: int
    max_positions: int
    sliding_window: int | None = None
    # set by ``_load_weights``: the embedding table, the output head (a view of it when tied; an ``Int8Linear``
    # once quantised) and each layer's weights (a model's own record type)
    _embed: torch.Tensor
    _lm_head: Any
    _layers: list[Any]

    # the projections of a layer (field names of its weights, each with its bias field or None) that
    # the int8 formats (``weights="int8"``, ``"int8-split"``) quantise; the embeddings (looked up, not multiplied)
    # and norms stay float
    _projections: tuple[tuple[str, str | None], ...] = ()

    def __init__(self, model_dir: Path, num_threads: int | None = None, dtype: torch.dtype = torch.float32, *,
                 rank: int = 0, world_size: int = 1, group: Any = None, weights: str = "float32",
                 device: torch.device | str = "cpu") -> None:
        from transformers import AutoTokenizer

        started_s = time.perf_counter()
        self.weights = check_weight_format(weights)
        if weights in INT8_FORMATS and dtype != torch.float32:
            raise ValueError(f"{weights} weights take float32 activations, not {dtype}")
        self.device = torch.device(device)
        if weights in INT8_FORMATS and self.device.type != "cpu":
            raise ValueError(f"stages.thinker.options.weights: {weights} weights run on the CPU only (fbgemm); a "
                             f"thinker on {self.device} takes float32")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of size {world_size}")
        self.rank, self.world_size, self.group = rank, world_size, group
        model_dir = Path(model_dir)
        self.model_dir = model_dir
        self.dtype = dtype
        raw = json.loads((model_dir / "config.json").read_text())
        self._read_config(raw)  # refuses a world_size the heads cannot be split over
        if world_size > 1:
            _check_group(rank, world_size, group)
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        eos = _as_ids(raw.get("eos_token_id"))
        generation_config = model_dir / "generation_config.json"
        if generation_config.is_file():
            eos.update(_as_ids(json.loads(generation_config.read_text()).get("eos_token_id")))
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        self._load_weights(model_dir / "model.safetensors")
        self._shard_lm_head()
        if weights in INT8_FORMATS:
            self._quantize(Int8SplitLinear if weights == "int8-split" else Int8Linear)
        self._requests: dict[str, _Request] = {}
        self._shared_prefix: tuple[tuple[int, ...], list[LayerCache]] | None = None
        logger.info("Loaded %s in %.1f s (%s weights, %d threads)", model_dir, time.perf_counter() - started_s,
                    weights if weights in INT8_FORMATS else dtype, torch.get_num_threads())

    # -- what a model supplies -------------------------------------------------

    def _read_config(self, raw: dict[str, Any]) -> None:
        raise NotImplementedError

    def _load_weights(self, path: Path) -> None:
        raise NotImplementedError

    def _new_caches(self) -> list[LayerCache]:
        """An empty cache per layer for a new request."""
        raise NotImplementedError

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, caches: list[list[LayerCache]],
                 masks: PrefillMasks | None, padded: bool, extend: bool = False) -> torch.Tensor:
        """Run all layers on ids [batch, seq] and return the last hidden states. Prefill (one request) passes
        ``masks``; ``extend`` when its cache already holds earlier tokens. Decode (seq 1, ``padded``) attends to
        each request's cache through ``gather_cache``."""
        raise NotImplementedError

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of final hidden states over this rank's lm_head rows (all of them at world_size 1)."""
        raise NotImplementedError

    # -- tensor-parallel sharding --------------------------------------------

    def _shard_attention(self, num_heads: int, num_kv_heads: int) -> None:
        """Pick this rank's query heads and the KV heads they use: sets ``_heads``/``_kv_heads`` (local counts)
        and ``_head_start``/``_kv_head_start`` (the first global index of each)."""
        world = self.world_size
        if num_heads % world:
            raise ValueError(f"tensor parallelism: world_size {world} does not divide the {num_heads} attention heads")
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} attention heads cannot share {num_kv_heads} KV heads evenly")
        heads, group = num_heads // world, num_heads // num_kv_heads  # group: query heads per KV head
        start = self.rank * heads
        if heads % group == 0:  # whole KV groups per rank: the KV heads split across ranks
            kv_heads, kv_start = heads // group, start // group
        elif group % heads == 0:  # part of one KV group per rank: that KV head is replicated
            kv_heads, kv_start = 1, start // group
        else:
            raise ValueError(
                f"tensor parallelism: world_size {world} gives each rank {heads} of the {num_heads} attention heads, "
                f"which splits the groups of {group} query heads sharing each of the {num_kv_heads} KV heads "
                "inconsistently")
        self._heads, self._head_start, self._kv_heads, self._kv_head_start = heads, start, kv_heads, kv_start

    def _shard(self, size: int) -> tuple[int, int]:
        """This rank's contiguous [start, stop) of a dimension of ``size`` split across the ranks."""
        return self._shard_of(self.rank, size)

    def _shard_lm_head(self) -> None:
        """Keep this rank's rows (its vocabulary slice) of the lm_head; a tied one stays a view of the embeddings."""
        if self.world_size == 1:
            return
        start, stop = self._shard(self.vocab_size)
        rows = self._lm_head[start:stop]
        self._lm_head = rows if self._lm_head is self._embed else rows.clone()  # a copy frees the full matrix

    def _final_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """float32 logits [..., vocab] on rank 0 (None on the others): each rank scores its vocabulary slice and
        rank 0 gathers them (slices padded to one size, as gather needs)."""
        part = self._logits(hidden)
        if self.world_size == 1:
            return part
        import torch.distributed as dist

        sizes = [stop - start for start, stop in (self._shard_of(r, self.vocab_size) for r in range(self.world_size))]
        padded = part.new_zeros(*part.shape[:-1], max(sizes))
        padded[..., : part.shape[-1]] = part
        gathered = [torch.empty_like(padded) for _ in sizes] if self.rank == 0 else None
        dist.gather(padded, gathered, group=self.group, group_dst=0)
        if gathered is None:
            return None
        return torch.cat([g[..., :size] for g, size in zip(gathered, sizes, strict=True)], dim=-1)

    def _quantize(self, kind: type[Int8Linear]) -> None:
        """Replace every layer projection and the lm_head by its ``kind`` (``Int8Linear`` or ``Int8SplitLinear``;
        the float matrices are freed, but for a tied lm_head's embeddings, which the lookup still reads)."""
        for layer in self._layers:
            for name, bias_name in self._projections:
                bias = getattr(layer, bias_name) if bias_name else None
                setattr(layer, name, kind(getattr(layer, name), bias))
                if bias_name:
                    setattr(layer, bias_name, None)
        self._lm_head = kind(self._lm_head)

    def weight_bytes(self) -> int:
        """Bytes of the weights a decode step reads (this rank's shard), the embedding table excluded."""
        def size(weight: Any) -> int:
            return weight.nbytes if isinstance(weight, Int8Linear) else weight.numel() * weight.element_size()

        total = size(self._lm_head)
        for layer in self._layers:
            total += sum(size(getattr(layer, name)) for name, _ in self._projections)
        return total

    def _shard_of(self, rank: int, size: int) -> tuple[int, int]:
        return rank * size // self.world_size, (rank + 1) * size // self.world_size

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum the partial outputs of a row-parallel projection across ranks (in place; nothing at world_size 1)."""
        if self.world_size > 1:
            torch.distributed.all_reduce(x, group=self.group)
        return x

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

    def rewind(self, request_id: str,
               checkpoint: tuple[int, list[tuple[torch.Tensor, torch.Tensor, int, int]]]) -> None:
        request = self._requests[request_id]
        request.num_tokens, marks = checkpoint
        for cache, mark in zip(request.caches, marks, strict=True):
            cache.reset(mark)

    def free(self, request_id: str) -> bool:
        """Release a request's KV cache; returns False if it held none."""
        return self._requests.pop(request_id, None) is not None

    def detach(self, request_id: str) -> KVPrefix | None:
        """End a request but hand its KV cache over (to be continued by a later ``prefill``); None if it held none."""
        request = self._requests.pop(request_id, None)
        return None if request is None else (request.caches, request.num_tokens)

    # -- forward passes ------------------------------------------------------

    def within_window(self, num_tokens: int) -> bool:
        """No cache drops an entry within ``num_tokens``: a cache of a prompt's first tokens can be continued."""
        return self.sliding_window is None or num_tokens <= self.sliding_window

    @torch.inference_mode()
    def set_shared_prefix(self, token_ids: list[int]) -> None:
        """Compute once the KV cache of a prefix many prompts start with (a preamble, a system prompt);
        ``prefill`` then copies it and runs only the rest of such a prompt. A prefix that fills a sliding window
        is ignored."""
        self._shared_prefix = None
        if not token_ids or not self.within_window(len(token_ids) + 1):
            return
        self.prefill(_SHARED_PREFIX_ID, token_ids, logits=False)
        cached = self._requests.pop(_SHARED_PREFIX_ID)
        self._shared_prefix = (tuple(token_ids), cached.caches)

    def shared_prefix_tokens(self, token_ids: list[int]) -> int:
        """How many leading tokens of a prompt the shared prefix's cache would spare its prefill (0: none)."""
        prefix = self._shared_prefix
        if prefix is None or not (len(prefix[0]) < len(token_ids) and self.within_window(len(token_ids))):
            return 0
        return len(prefix[0]) if tuple(token_ids[: len(prefix[0])]) == prefix[0] else 0

    @torch.inference_mode()
    def prefill(self, request_id: str, token_ids: list[int], *, logits: bool = True,
                continue_from: KVPrefix | None = None) -> torch.Tensor | None:
        """Run the prompt of a new request, create its cache, return float32 logits [vocab] of the last position
        (None with ``logits=False``, which skips the lm_head: a tensor-parallel follower's call).
        ``continue_from``: caches holding the KV of the prompt's first tokens (fewer than all of them, within the
        window: ``within_window``), taken over and extended; otherwise the shared prefix's, when the prompt starts
        with it."""
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already active; free() it first")
        if not token_ids:
            raise ValueError("token_ids must not be empty")
        self._check_tokens(token_ids, len(token_ids))
        num_tokens = len(token_ids)
        if continue_from is not None:
            caches, start = continue_from
            if not (0 < start < num_tokens and self.within_window(num_tokens)):
                raise ValueError(f"cannot continue a prompt of {num_tokens} tokens from {start} cached ones")
        elif self._shared_prefix is not None and (start := self.shared_prefix_tokens(token_ids)):
            caches = [cache.clone() for cache in self._shared_prefix[1]]  # run only the new tokens against it
        else:
            start, caches = 0, self._new_caches()
        positions = torch.arange(start, num_tokens, device=self.device).unsqueeze(0)
        # [query, key]: how far back the key is
        distance = positions.T - torch.arange(num_tokens, device=self.device).unsqueeze(0)
        causal = distance >= 0
        local = causal if self.sliding_window is None else causal & (distance < self.sliding_window)
        masks = (local[None, None], causal[None, None])
        ids = torch.tensor([token_ids[start:]], dtype=torch.long, device=self.device)
        hidden = self._forward(ids, positions, [caches], masks, padded=False, extend=start > 0)
        self._requests[request_id] = _Request(caches=caches, num_tokens=num_tokens)
        return self._final_logits(hidden[0, -1]) if logits else None

    @torch.inference_mode()
    def decode(self, request_ids: list[str], token_ids: list[int], *, logits: bool = True) -> torch.Tensor | None:
        """Feed one token per active request in one batched forward; returns float32 logits [batch, vocab] (None
        with ``logits=False``)."""
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
        positions = torch.tensor([[r.num_tokens] for r in requests], dtype=torch.long, device=self.device)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device).unsqueeze(1)
        hidden = self._forward(ids, positions, [r.caches for r in requests], None, padded=True)
        for request in requests:
            request.num_tokens += 1
        return self._final_logits(hidden[:, 0]) if logits else None

    def _check_tokens(self, token_ids: list[int], context_tokens: int) -> None:
        if context_tokens > self.max_positions:
            raise ValueError(f"context of {context_tokens} tokens exceeds {self.max_positions}")
        if min(token_ids) < 0 or max(token_ids) >= self.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")


class ShardedCheckpoint:
    """A safetensors file read tensor by tensor, whole or as a slice of rows or columns (only the slice is read),
    converted to ``dtype`` on ``device`` (read there directly: a GPU's weights never sit whole in host memory). Use
    as a context manager; ``unused`` names the tensors nothing asked for."""

    def __init__(self, path: Path, dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        from safetensors import safe_open

        self._device = torch.device(device)
        self._file = safe_open(str(path), framework="pt", device=str(self._device))
        self._dtype = dtype
        self._unused = set(self._file.keys())

    def __enter__(self) -> ShardedCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.__exit__(*exc)

    def __contains__(self, name: str) -> bool:
        return name in self._unused

    def unused(self) -> list[str]:
        return sorted(self._unused)

    def full(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        self._unused.discard(name)
        return self._file.get_tensor(name).to(self._device, dtype or self._dtype).contiguous()

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a matrix (or elements of a vector: a bias)."""
        self._unused.discard(name)
        return self._file.get_slice(name)[start:stop].to(self._device, self._dtype).contiguous()

    def columns(self, name: str, start: int, stop: int) -> torch.Tensor:
        self._unused.discard(name)
        return self._file.get_slice(name)[:, start:stop].to(self._device, self._dtype).contiguous()


def _check_group(rank: int, world_size: int, group: Any) -> None:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"tensor parallelism over {world_size} ranks needs an initialised torch.distributed")
    if dist.get_world_size(group) != world_size or dist.get_rank(group) != rank:
        raise ValueError(f"rank {rank} of {world_size} does not match the process group's rank "
                         f"{dist.get_rank(group)} of {dist.get_world_size(group)}")


def gather_cache(layer_caches: list[LayerCache], k: torch.Tensor, v: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Append each request's new K/V (k, v: [batch, kv_heads, 1, head_dim]), then stack the visible caches
    right-padded, with a key mask [batch, 1, 1, keys] (None for a batch of one)."""
    views = []
    for b, cache in enumerate(layer_caches):
        cache.append(k[b], v[b])
        views.append(cache.view())
    if len(views) == 1:
        return views[0][0][None], views[0][1][None], None
    sizes = [key.shape[1] for key, _ in views]
    lengths = torch.tensor(sizes, device=k.device)
    longest = max(sizes)  # from the host's numbers: no device sync per layer
    keys = k.new_empty(len(views), k.shape[1], longest, k.shape[3])
    values = torch.empty_like(keys)
    for b, (key, value) in enumerate(views):
        length = key.shape[1]
        keys[b, :, :length] = key
        values[b, :, :length] = value
        keys[b, :, length:] = 0  # padding must stay finite: masked weights are 0, and 0 * nan = nan
        values[b, :, length:] = 0
    mask = (torch.arange(longest, device=k.device)[None, :] < lengths[:, None])[:, None, None, :]
    return keys, values, mask


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [batch, 1, seq, head_dim] of positions [batch, seq]."""
    freqs = positions[..., None].float() * inv_freq  # [batch, seq, head_dim / 2]
    angles = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _as_ids(value: Any) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in (value if isinstance(value, list) else [value])}

"""What the family's torch decoders share: the KV cache of every request in one pool of blocks
(``stage/kv_cache.py``'s ``PagedKVCache``, the decoder's ``kv``) and the prefill / batched-decode entry points the
thinker runner drives.

A request reserves its blocks (``reserve``: its prompt and all it may generate; the leading blocks of its prompt
that an earlier request computed are shared by their chained hashes, not computed again), is prefilled (a piece at
a time, or whole) and then decodes with the others: ``decode`` runs one batched forward for requests sitting at
different positions, each row reading its own blocks (a shorter row's padding reads the cache's zero row, masked,
so a NaN in one request's cache never reaches another's). ``step_masks`` builds each step's masks from the rows'
positions: causal, and within the sliding window for a model's sliding-window layers. ``free`` releases a request's
blocks; given the tokens it ran, its reply's blocks serve later prompts too (a conversation's next turn). A model
(``GemmaThinker``, ``Qwen2Thinker``) supplies its config, weights, layers and logits. Not thread-safe: drive it
from one thread.

Tensor parallelism (Megatron style): ``world_size`` processes, each constructed with its ``rank`` and a
``torch.distributed`` process group, hold one shard each and run the same calls in the same order. Rank r keeps a
contiguous slice of the query heads with their q/k/v rows (and biases), and the KV heads those queries use: split
across ranks when ``num_kv_heads`` divides by ``world_size``, otherwise each rank keeps (a replica of) the one its
queries share. The o projection is row-parallel (the input columns of the rank's heads), the MLP's gate/up are
column-parallel (a slice of the intermediate dimension) and its down projection row-parallel; the partial outputs
of o and down are summed with one all-reduce each, so every rank ends a layer with the same hidden states.
Embeddings and norms are replicated; the lm_head is split by vocabulary (each rank scores its slice of the tokens)
and rank 0 gathers the slices: only rank 0 gets logits, the others get None. Every rank must pass the same
``logits`` to ``prefill``/``decode`` (``False`` skips the lm_head and the gather everywhere). Each rank's KV pool
holds only its own KV heads, in as many blocks as every other rank's: the ranks make the same calls in the same
order (``reserve``, ``prefill``, ``decode``, ``free``, ``kv.set_length``), so their block tables agree. With
``world_size`` 1 there is no communication at all.

``device`` (the stage's, e.g. ``cuda:1``): the weights are read from the checkpoint straight onto it, and the KV
pool and every step's tensors live there; logits come back on it. int8 weights (``int8``, ``int8-split``) are CPU
only (fbgemm).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from omnipipe.models.default.modeling.quantized import INT8_FORMATS, Int8Linear, Int8SplitLinear, check_weight_format
from omnipipe.stage.kv_cache import DEFAULT_BLOCK_TOKENS, KVBudgetError, PagedKVCache, block_hashes

logger = logging.getLogger(__name__)

# the KV pool a decoder is made with when its caller names none (``use_kv_cache`` replaces it): tokens of every
# request together
DEFAULT_KV_CACHE_TOKENS = 4096


class CachedDecoder:
    """A decoder over a converted checkpoint directory (config.json + model.safetensors + tokenizer) with one KV
    pool for its requests (``kv``: ``kv_cache_tokens`` tokens; ``use_kv_cache`` makes another). Subclasses set
    ``vocab_size``, ``max_positions``, ``sliding_window`` (None: full attention everywhere) and implement
    ``_read_config`` (which calls ``_shard_attention``), ``_load_weights`` (keeping this rank's slices, see
    ``ShardedCheckpoint``), ``kv_shape``, ``_forward`` (over the local ``_heads`` and ``_kv_heads``, passing the
    outputs of o and down through ``_reduce``) and ``_logits``.

    ``rank``, ``world_size`` and ``group`` (a ``torch.distributed`` process group; None: the default one) shard the
    model for tensor parallelism (see the module docstring); a ``world_size`` that does not divide the heads, or
    that would split a rank's queries across KV groups unevenly, is refused with a ValueError."""

    vocab_size: int
    max_positions: int
    sliding_window: int | None = None
    kv: PagedKVCache
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
                 device: torch.device | str = "cpu", kv_cache_tokens: int = DEFAULT_KV_CACHE_TOKENS) -> None:
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
        self.use_kv_cache(kv_cache_tokens)
        logger.info("Loaded %s in %.1f s (%s weights, %d threads)", model_dir, time.perf_counter() - started_s,
                    weights if weights in INT8_FORMATS else dtype, torch.get_num_threads())

    # -- what a model supplies -------------------------------------------------

    def _read_config(self, raw: dict[str, Any]) -> None:
        raise NotImplementedError

    def _load_weights(self, path: Path) -> None:
        raise NotImplementedError

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run all layers on ids [rows, seq] at ``positions`` [rows, seq] of the step bound to ``kv`` and return
        the last hidden states; each attention layer stores its keys and values with ``kv.update`` and attends
        under ``step_masks``."""
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
        self._num_kv_heads = num_kv_heads

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

    # -- the KV cache -----------------------------------------------------------

    def kv_shape(self) -> tuple[int, int, int]:
        """(layers, this rank's KV heads, head dim) of the KV cache."""
        raise NotImplementedError

    def token_bytes(self) -> int:
        """Bytes of keys and values one token takes in every layer of the whole model (every rank's heads)."""
        layers, _, head_dim = self.kv_shape()
        return 2 * layers * self._num_kv_heads * head_dim * torch.empty((), dtype=self.dtype).element_size()

    def use_kv_cache(self, tokens: int, *, block_tokens: int = DEFAULT_BLOCK_TOKENS, prefix_caching: bool = False,
                     max_cached_blocks: int | None = None) -> None:
        """Make the KV pool every request's cache is in: ``tokens`` tokens of all requests together, in blocks of
        ``block_tokens`` (this rank's KV heads only: every rank of a tensor-parallel model has the same blocks);
        ``prefix_caching`` (off unless asked) and ``max_cached_blocks`` as ``PagedKVCache`` takes them. No request
        may hold any."""
        if getattr(self, "kv", None) is not None and self.kv.used_tokens():
            raise RuntimeError("the KV pool is replaced while requests hold some of it")
        layers, kv_heads, head_dim = self.kv_shape()
        self.kv = PagedKVCache(layers, kv_heads, head_dim, max(1, tokens // block_tokens), block_tokens=block_tokens,
                               dtype=self.dtype, device=self.device, prefix_caching=prefix_caching,
                               max_cached_blocks=max_cached_blocks)

    def active_requests(self) -> list[str]:
        """Ids of requests that currently hold a KV cache."""
        return self.kv.holders()

    def num_cached_tokens(self, request_id: str) -> int:
        """Tokens processed so far for a request (its next position)."""
        return self.kv.length(request_id)

    def kv_cache_bytes(self) -> int:
        """Bytes of the KV blocks the requests hold (this rank's heads)."""
        layers, kv_heads, head_dim = self.kv_shape()
        block = 2 * layers * kv_heads * head_dim * self.kv.block_tokens * self.kv.keys[0].element_size()
        return self.kv.reserved_blocks() * block

    def reserve(self, request_id: str, tokens: int, prompt_ids: list[int] | None = None) -> bool:
        """Reserve room for ``tokens`` tokens of a request (its prompt and all it may generate), sharing the
        leading blocks of its prompt ``prompt_ids`` that an earlier request computed (``kv.shared_tokens`` says how
        many tokens); False when the free blocks are too few now, ``KVBudgetError`` when the whole pool is."""
        prompt = prompt_ids or []
        hashes = block_hashes(prompt, self.kv.block_tokens) if self.kv.prefix_caching else []
        return self.kv.reserve(request_id, tokens, prompt_tokens=len(prompt), hashes=hashes)

    def free(self, request_id: str, ran: list[int] | None = None, *, written: bool = True) -> bool:
        """Release a request's KV cache (``ran``: every token it ran through the model, prompt then reply, so that
        its blocks serve later prompts beginning with them; ``written=False``: its last step failed and what it
        wrote is not kept); False if it held none."""
        if not self.kv.holds(request_id):
            return False
        if ran is not None and self.kv.prefix_caching:
            self.kv.extend_hashes(request_id, block_hashes(ran[: self.kv.length(request_id)], self.kv.block_tokens))
        self.kv.release(request_id, written=written)
        return True

    # -- forward passes ------------------------------------------------------

    def step_masks(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The bound step's attention masks [rows, 1, query, keys] (True: attend) for the queries at
        ``positions`` [rows, query]: (within the sliding window, causal); key j is history position j, and the
        slots past a row's end read the cache's zero padding row, masked."""
        keys = torch.arange(self.kv.get_seq_length(), device=self.device).view(1, 1, -1)
        distance = positions.unsqueeze(-1) - keys  # [rows, query, keys]: how far back the key is
        causal = distance >= 0
        local = causal if self.sliding_window is None else causal & (distance < self.sliding_window)
        return local[:, None], causal[:, None]

    @torch.inference_mode()
    def prefill(self, request_id: str, token_ids: list[int], *, logits: bool = True) -> torch.Tensor | None:
        """Run a request's prompt ``token_ids`` (or its first part, a piece at a time) past what its cache holds
        already (blocks shared from earlier requests, earlier pieces); return float32 logits [vocab] of its last
        position (None with ``logits=False``, which skips the lm_head: a tensor-parallel follower's call, or a
        piece before the last). A request that holds no cache yet reserves room for the prompt first."""
        if not token_ids:
            raise ValueError("token_ids must not be empty")
        self._check_tokens(token_ids, len(token_ids))
        if not self.kv.holds(request_id) and not self.reserve(request_id, len(token_ids), token_ids):
            raise KVBudgetError(f"no room in the KV cache for a prompt of {len(token_ids)} tokens now")
        start = self.kv.length(request_id)
        if start >= len(token_ids):
            raise ValueError(f"request {request_id!r} holds all {len(token_ids)} of these tokens already")
        self.kv.bind([request_id], len(token_ids) - start)
        ids = torch.tensor([token_ids[start:]], dtype=torch.long, device=self.device)
        hidden = self._forward(ids, self.kv.positions())
        return self._final_logits(hidden[0, -1]) if logits else None

    @torch.inference_mode()
    def decode(self, request_ids: list[str], token_ids: list[int], *, logits: bool = True) -> torch.Tensor | None:
        """Feed one token per active request in one batched forward; returns float32 logits [batch, vocab] (None
        with ``logits=False``). A request reserved for fewer tokens takes one more block when it needs it."""
        if len(request_ids) != len(token_ids):
            raise ValueError("request_ids and token_ids must have the same length")
        if not request_ids:
            raise ValueError("request_ids must not be empty")
        if len(set(request_ids)) != len(request_ids):
            raise ValueError("request_ids must be unique")
        missing = [rid for rid in request_ids if not self.kv.holds(rid)]
        if missing:
            raise KeyError(f"unknown request ids (prefill first): {missing}")
        lengths = [self.kv.length(rid) for rid in request_ids]
        self._check_tokens(token_ids, max(lengths) + 1)
        for rid, length in zip(request_ids, lengths, strict=True):
            if not self.kv.reserve(rid, length + 1):
                raise KVBudgetError(f"no room in the KV cache for request {rid}'s next token")
        self.kv.bind(request_ids, 1)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device).unsqueeze(1)
        hidden = self._forward(ids, self.kv.positions())
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

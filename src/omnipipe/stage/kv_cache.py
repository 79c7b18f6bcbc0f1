"""One KV cache for every request of an autoregressive checkpoint stage: a pool of fixed-size blocks reserved at
start from a memory budget, each request holding the blocks its prompt and reply can fill.

``PagedKVCache`` is what a transformers decoder is given as ``past_key_values``: before each forward the runner
binds the rows of the batch (``bind``: which requests, how many new tokens each), the model's attention layers call
``update`` with the new keys and values of every row, and get back each row's whole history, gathered from its
blocks and padded to the longest row's whole blocks; ``attention_mask`` masks the padding and the future, row by
row. A request
reserves all the blocks it can ever need when it is admitted (``reserve``: its prompt plus its ``max_tokens``), so
a decode step never runs out of memory: a request that does not fit waits until another frees its blocks.

Undoing a step is setting a request's length back (``set_length``): what a failed step wrote past it is never read.

A shorter row's padding reads one row of its own past the blocks (``pad_slot``), zero and never written, never a
live request's: a NaN in one request's cache stays in its own row (masked weights are 0, and 0 x NaN is NaN). A
bucketed step's padding rows write to a scratch row past it (``scratch_slot``), which nothing reads.

Automatic prefix caching: a request may give ``reserve`` the chained hash of each full block of its prompt
(``block_hashes``: block i's hash covers every position up to its end, a token by its id, a multimodal position by
its content). Its leading blocks whose hashes the cache holds are shared, not computed (a reference count each; at
least the prompt's last token is left to prefill), and its own full blocks join the index once written. A block no
request holds keeps its KV while the pool has other free blocks: it is taken back (and forgotten) least recently
used first. A family whose later stage reads hidden states of the prompt (the talker's hand-off) gives them with
``set_extras``; its blocks are indexed with their rows of them, and a prefix is shared only as far as they go.
A family that shares what a request generated too (a conversation's next turn repeats the last answer) gives the
hashes of its prompt and reply with ``extend_hashes`` before it releases it. ``max_cached_blocks`` bounds the
blocks kept for later requests: past it, the least recently used is forgotten as it is released.

Paged attention (``stage/paged_attention.py``): with ``kernel`` set, ``update`` hands the attention the layer's
pools rather than each row's gathered history, and ``step_inputs`` adds the step's block tables and lengths for the
kernel of that name to read.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

DEFAULT_BLOCK_TOKENS = 16


@dataclass
class _Entry:
    blocks: list[int]
    length: int = 0  # tokens written and kept
    hashes: list[bytes] = field(default_factory=list)  # of each full block of its prompt
    indexed: int = 0  # its leading blocks that are in the index (shared from it, or written and added)
    shared: int = 0  # tokens it found in the index: never written by it
    needs_extras: bool = False  # its blocks are indexed with their rows of ``extras`` only
    extras: dict[int, torch.Tensor] | None = None  # the prompt's hidden states a later stage reads [T, D], host


@dataclass(frozen=True)
class _BoundStep:
    """A bound forward's view of the cache, every tensor on the cache's device: ``starts`` [rows] (each row's
    first new position), ``tables`` [rows, blocks] (its blocks, -1 past them), ``slots`` [rows, width] (the pool
    row each history position reads: the padding's row past the row's end), ``writes`` [rows x query] (where
    its new tokens go: a padding row's to the scratch row)."""

    starts: torch.Tensor
    tables: torch.Tensor
    slots: torch.Tensor
    writes: torch.Tensor
    query: int

    @classmethod
    def on_device(cls, packed: torch.Tensor, query: int, width: int, block_tokens: int, pad_slot: int,
                  scratch_slot: int) -> _BoundStep:
        """From ``packed`` [rows, 1 + blocks] (each row's start, then its blocks), on its device."""
        starts, tables = packed[:, 0], packed[:, 1:]
        position = torch.arange(width, device=packed.device)
        blocks = tables[:, position // block_tokens]  # [rows, width]
        ends = (starts + query).view(-1, 1)
        slots = torch.where((position.view(1, -1) < ends) & (blocks >= 0), blocks * block_tokens
                            + position % block_tokens, pad_slot)
        new = starts.view(-1, 1) + torch.arange(query, device=packed.device).view(1, -1)  # [rows, query]
        writes = torch.where((tables[:, :1] >= 0), slots.gather(1, new), scratch_slot)
        return cls(starts, tables, slots, writes.reshape(-1), query)


class KVBudgetError(ValueError):
    """A request that can never fit the stage's KV budget (even alone)."""


class PagedKVCache:
    """A block pool [layers] x [blocks x block_tokens, kv_heads, head_dim] for keys and for values."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, num_blocks: int, *,
                 block_tokens: int = DEFAULT_BLOCK_TOKENS, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", prefix_caching: bool = True,
                 max_cached_blocks: int | None = None) -> None:
        if num_blocks < 1:
            raise ValueError("a KV cache needs at least one block")
        self.prefix_caching = prefix_caching
        self.max_cached_blocks = max_cached_blocks  # indexed blocks no request holds, at most (None: any)
        self.block_tokens = block_tokens
        self.num_blocks = num_blocks
        self.dtype, self.device = dtype, torch.device(device)
        self.pad_slot = num_blocks * block_tokens  # the padding's row: past every block, always zero
        self.scratch_slot = self.pad_slot + 1  # where a padding row of a bucketed step writes (never read)
        shape = (num_blocks * block_tokens + 2, kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self._free = list(range(num_blocks - 1, -1, -1))  # blocks holding nothing
        self._entries: dict[str, _Entry] = {}
        self._refs = [0] * num_blocks  # requests holding each block
        self._index: dict[bytes, int] = {}  # a full block's hash -> the block holding its KV
        self._hash_of: dict[int, bytes] = {}
        self._extras: dict[int, dict[int, torch.Tensor]] = {}  # an indexed block's rows of its request's extras
        self._cached: OrderedDict[int, None] = OrderedDict()  # indexed blocks no request holds, least recent first
        self.prefix_queries = 0  # prompt tokens looked up in the index, and found there (what vLLM counts)
        self.prefix_hits = 0
        self.kernel: str | None = None  # a paged attention kernel's name (``paged_attention.py``); None: dense
        self._bound: _BoundStep | None = None

    @classmethod
    def for_model(cls, text_config: Any, budget_bytes: int, *, block_tokens: int = DEFAULT_BLOCK_TOKENS,
                  dtype: torch.dtype, device: str | torch.device, prefix_caching: bool = True) -> PagedKVCache:
        """As many blocks as ``budget_bytes`` holds for a decoder of ``text_config`` (layers, kv heads, head dim)."""
        layers, heads, dim = model_shape(text_config)
        per_token = token_bytes(text_config, dtype)
        num_blocks = budget_bytes // (per_token * block_tokens)  # the padding and scratch rows come on top
        if num_blocks < 1:
            raise KVBudgetError(f"a KV budget of {budget_bytes} bytes holds no block of {block_tokens} tokens "
                                f"({per_token} bytes a token): raise kv_cache_bytes")
        return cls(layers, heads, dim, int(num_blocks), block_tokens=block_tokens, dtype=dtype, device=device,
                   prefix_caching=prefix_caching)

    # ------------------------------------------------------------------------------------------- reservations
    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_tokens

    @property
    def free_blocks(self) -> int:
        """Blocks a reservation can take: empty ones, and indexed ones no request holds (their KV forgotten)."""
        return len(self._free) + len(self._cached)

    def blocks_for(self, tokens: int) -> int:
        return max(1, math.ceil(tokens / self.block_tokens))

    def fits_ever(self, tokens: int) -> bool:
        return self.blocks_for(tokens) <= self.num_blocks

    def reserve(self, key: str, tokens: int, *, prompt_tokens: int = 0, hashes: Sequence[bytes] = (),
                needs_extras: bool = False) -> bool:
        """Reserve room for ``tokens`` tokens of request ``key`` (more blocks if it holds some already). False when
        the free blocks are too few now; ``KVBudgetError`` when the whole pool is too small for it.

        A new request's ``hashes`` (``block_hashes`` of its prompt of ``prompt_tokens`` tokens) share the leading
        blocks the index holds: ``length(key)`` is then where its prefill starts. ``needs_extras``: only blocks
        indexed with their rows of extras are shared, and its own are indexed once it gave them (``set_extras``)."""
        if not self.fits_ever(tokens):
            raise KVBudgetError(f"needs {tokens} tokens of KV cache, more than the stage's whole budget holds "
                                f"({self.capacity_tokens} tokens): raise kv_cache_bytes (or gpu_memory_fraction), "
                                "or lower max_tokens")
        entry = self._entries.get(key)
        if entry is not None:
            more = self.blocks_for(tokens) - len(entry.blocks)
            if more > self.free_blocks:
                return False
            entry.blocks.extend(self._take_free() for _ in range(max(0, more)))
            return True
        found = self._lookup(hashes, prompt_tokens, needs_extras) if self.prefix_caching else []
        reusable = sum(1 for block in found if block in self._cached)  # counted among the free blocks now
        more = self.blocks_for(tokens) - len(found)
        if more > self.free_blocks - reusable:
            return False
        for block in found:
            self._cached.pop(block, None)
            self._refs[block] += 1
        blocks = found + [self._take_free() for _ in range(max(0, more))]
        shared = len(found) * self.block_tokens
        self._entries[key] = _Entry(blocks, length=shared, hashes=list(hashes) if self.prefix_caching else [],
                                    indexed=len(found), shared=shared, needs_extras=needs_extras)
        if self.prefix_caching and prompt_tokens:
            self.prefix_queries += prompt_tokens
            self.prefix_hits += shared
        return True

    def _lookup(self, hashes: Sequence[bytes], prompt_tokens: int, needs_extras: bool) -> list[int]:
        """The indexed blocks of the prompt's leading hashes (its last token left to compute)."""
        found: list[int] = []
        for block_hash in hashes[: max(0, prompt_tokens - 1) // self.block_tokens]:
            block = self._index.get(block_hash)
            if block is None or (needs_extras and block not in self._extras):
                break
            found.append(block)
        return found

    def _take_free(self) -> int:
        """An empty block, else the least recently used indexed block no request holds (forgotten)."""
        block = self._free.pop() if self._free else self._forget_oldest_cached()
        self._refs[block] = 1
        return block

    def _forget_oldest_cached(self) -> int:
        """Take the least recently used indexed block no request holds out of the index; its number."""
        block, _ = self._cached.popitem(last=False)
        del self._index[self._hash_of.pop(block)]
        self._extras.pop(block, None)
        return block

    def shared_tokens(self, key: str) -> int:
        """Tokens of request ``key`` found in the index when it was reserved."""
        return self._entries[key].shared

    def set_extras(self, key: str, extras: dict[int, torch.Tensor]) -> None:
        """The hidden states a later stage reads of request ``key``'s whole prompt ({layer: [T, D]}, kept on the
        host): its blocks are indexed with their rows."""
        entry = self._entries[key]
        entry.extras = {layer: rows.detach().to("cpu") for layer, rows in extras.items()}
        self._index_written(entry)

    def prefix_extras(self, key: str) -> dict[int, torch.Tensor]:
        """The extras of the blocks request ``key`` shares ({layer: [shared tokens, D]}; empty when it shares none)."""
        entry = self._entries[key]
        shared = entry.blocks[: entry.shared // self.block_tokens]
        if not shared:
            return {}
        layers = self._extras[shared[0]]
        return {layer: torch.cat([self._extras[block][layer] for block in shared]) for layer in layers}

    def _index_written(self, entry: _Entry) -> None:
        """Add the request's full blocks written since to the index (with their extras, if it needs them)."""
        if not self.prefix_caching or (entry.needs_extras and entry.extras is None):
            return
        upto = min(entry.length // self.block_tokens, len(entry.hashes))
        for position in range(entry.indexed, upto):
            block_hash, block = entry.hashes[position], entry.blocks[position]
            if block_hash in self._index:  # another request wrote the same block first: this one stays its own
                continue
            self._index[block_hash], self._hash_of[block] = block, block_hash
            if entry.extras is not None:
                rows = slice(position * self.block_tokens, (position + 1) * self.block_tokens)
                self._extras[block] = {layer: values[rows] for layer, values in entry.extras.items()}
        entry.indexed = max(entry.indexed, upto)

    def extend_hashes(self, key: str, hashes: Sequence[bytes]) -> None:
        """The chained hashes of request ``key``'s full blocks beyond its prompt's (``block_hashes`` of the tokens
        it ran: its prompt, then its reply); they start with the ones it was reserved with. Its blocks written
        that far join the index as its prompt's do."""
        entry = self._entries[key]
        if not self.prefix_caching:
            return
        if list(hashes[: len(entry.hashes)]) != entry.hashes:
            raise ValueError(f"request {key}'s hashes do not begin with its prompt's")
        entry.hashes = list(hashes[: len(entry.blocks)])

    def index_written(self, key: str) -> None:
        """Add request ``key``'s full blocks written so far to the index now (``bind`` does it for the rows it
        binds; a request that steps no more, such as a prefix held for good, needs this)."""
        self._index_written(self._entries[key])

    def holds(self, key: str) -> bool:
        return key in self._entries

    def holders(self) -> list[str]:
        """The requests that hold blocks."""
        return list(self._entries)

    def release(self, key: str, *, written: bool = True) -> None:
        """Free request ``key``'s blocks: an indexed block no other request holds keeps its KV for later requests
        (the prompt's first blocks the longest), any other goes back empty. ``written=False`` when its last step
        failed before it could be undone (what that step wrote is not indexed)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        if written:
            self._index_written(entry)
        for block in reversed(entry.blocks):
            self._refs[block] -= 1
            if self._refs[block]:
                continue
            if block in self._hash_of:
                self._cached[block] = None
            else:
                self._free.append(block)
        while self.max_cached_blocks is not None and len(self._cached) > self.max_cached_blocks:
            self._free.append(self._forget_oldest_cached())

    def length(self, key: str) -> int:
        return self._entries[key].length

    def set_length(self, key: str, length: int) -> None:
        """Forget what was written after ``length`` tokens (undo a step)."""
        entry = self._entries[key]
        if not max(entry.shared, entry.indexed * self.block_tokens) <= length <= entry.length:
            raise ValueError(f"cannot set {key}'s KV length to {length} (it holds {entry.length}, "
                             f"{entry.indexed * self.block_tokens} of them shared)")
        entry.length = length

    def used_tokens(self) -> int:
        return sum(e.length for e in self._entries.values())

    def reserved_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    def cached_blocks(self) -> int:
        """Indexed blocks no request holds: KV kept for later requests."""
        return len(self._cached)

    # --------------------------------------------------------------------------------------------- a forward
    def bind(self, keys: list[str], query_tokens: int, *, rows: int | None = None, width: int | None = None) -> None:
        """The next forward writes ``query_tokens`` new tokens for each row (request ``keys[b]``), after what the
        row holds; each row's length grows by as much (``set_length`` undoes it).

        A bucketed step (its shapes fixed, so one compiled graph, or one captured CUDA graph, serves every step of
        its bucket): ``rows`` pads the batch with rows of no request (they read the zero padding row, write the
        scratch row; their outputs mean nothing), ``width`` (whole blocks) fixes the history's width.

        What the step's forward reads (its slots, writes, mask, positions and block tables) is built on the cache's
        device from one host -> device copy of each row's start and block table."""
        starts = []
        for key in keys:
            entry = self._entries[key]
            self._index_written(entry)  # what the steps before wrote
            start = entry.length
            if start + query_tokens > len(entry.blocks) * self.block_tokens:
                raise KVBudgetError(f"request {key} writes past the KV it reserved ({start} + {query_tokens} > "
                                    f"{len(entry.blocks) * self.block_tokens} tokens)")
            starts.append(start)
        # whole blocks: the step's shapes change once a block, not every step (kernels planned per shape, and
        # compiled graphs, keep theirs); the slots past a row's end read the padding row, masked
        needed = self.blocks_for(max(starts) + query_tokens) * self.block_tokens
        if width is not None and (width < needed or width % self.block_tokens):
            raise ValueError(f"a step's width of {width} tokens holds not the {needed} of its longest row in whole "
                             f"blocks of {self.block_tokens}")
        padding = (len(keys) if rows is None else rows) - len(keys)
        if padding < 0:
            raise ValueError(f"a bucket of {rows} rows holds no batch of {len(keys)}")
        width = width or needed
        held = [self._entries[key].blocks for key in keys]
        table_width = max(width // self.block_tokens, *(len(blocks) for blocks in held))
        # one row a request: its start, then its blocks in order (-1 past them; a padding row holds none)
        packed = torch.full((len(keys) + padding, 1 + table_width), -1, dtype=torch.long)
        packed[:, 0] = 0
        for row, (key, blocks) in enumerate(zip(keys, held, strict=True)):
            packed[row, 0] = starts[row]
            packed[row, 1:1 + len(blocks)] = torch.tensor(blocks, dtype=torch.long)
            self._entries[key].length = starts[row] + query_tokens
        self._bound = _BoundStep.on_device(packed.to(self.device), query_tokens, width, self.block_tokens,
                                           self.pad_slot, self.scratch_slot)

    def step_inputs(self) -> dict[str, Any]:
        """The bound step's keyword arguments for the decoder: its mask, this cache, and with a paged attention
        kernel its ``PagedStep`` and the kernel's name."""
        inputs: dict[str, Any] = {"attention_mask": self.attention_mask(), "past_key_values": self, "use_cache": True}
        if self.kernel is not None:
            inputs.update(paged_step=self.paged_step(), paged_kernel=self.kernel)
        return inputs

    def _step(self, what: str) -> _BoundStep:
        if self._bound is None:
            raise RuntimeError(f"bind the batch before asking for its {what}")
        return self._bound

    def paged_step(self) -> Any:
        """The bound step as a paged kernel reads it (``paged_attention.PagedStep``)."""
        from omnipipe.stage.paged_attention import PagedStep

        step = self._step("paged step")
        return PagedStep(step.tables.to(torch.int32), (step.starts + step.query).to(torch.int32),
                         step.starts.to(torch.int32), step.slots, self.block_tokens)

    def attention_mask(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The bound step's additive mask [rows, 1, query, keys]: 0 where query i of row b may see key j (j <= its
        start + i), the dtype's lowest value elsewhere (the future and the padding past a shorter row)."""
        step = self._step("mask")
        keys = torch.arange(step.slots.shape[1], device=self.device).view(1, 1, -1)
        visible = keys <= (step.starts.view(-1, 1, 1) + torch.arange(step.query, device=self.device).view(1, -1, 1))
        dtype = dtype or self.dtype
        mask = torch.zeros(visible.shape, dtype=dtype, device=self.device).masked_fill(~visible, torch.finfo(dtype).min)
        return mask[:, None]

    def positions(self) -> torch.Tensor:
        """The bound step's token positions in the cache [rows, query] (each row's start onwards)."""
        step = self._step("positions")
        return step.starts.view(-1, 1) + torch.arange(step.query, device=self.device).view(1, -1)

    # ----------------------------------------------------------------------- what transformers' layers call
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               _cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the bound rows' new keys/values [rows, heads, query, dim]; return every row's keys/values so far
        [rows, heads, longest, dim] (padding past a row's length is masked)."""
        if self._bound is None:
            raise RuntimeError("PagedKVCache.update before bind")
        slots, writes = self._bound.slots, self._bound.writes
        heads, dim = key_states.shape[1], key_states.shape[3]
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(0, writes, key_states.transpose(1, 2).reshape(-1, heads, dim).to(keys.dtype))
        values.index_copy_(0, writes, value_states.transpose(1, 2).reshape(-1, heads, dim).to(values.dtype))
        if self.kernel is not None:  # the kernel reads the blocks itself
            return keys, values
        return keys[slots].transpose(1, 2), values[slots].transpose(1, 2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self._bound is None else int(self._bound.slots.shape[1])

    is_compileable = False


def block_hashes(position_keys: Sequence[int | bytes], block_tokens: int) -> list[bytes]:
    """The chained hash of each full block of a prompt whose positions are ``position_keys`` (a token's id, or the
    bytes that name a position's content where it is not a token: an image's, an audio clip's): block i's hash
    covers every position up to its end, so equal hashes mean equal prefixes."""
    hashes: list[bytes] = []
    parent = b""
    for start in range(0, len(position_keys) - block_tokens + 1, block_tokens):
        digest = hashlib.blake2b(parent, digest_size=16)
        for key in position_keys[start:start + block_tokens]:
            if isinstance(key, bytes):
                digest.update(b"m%d:" % len(key) + key)
            else:
                digest.update(b"t" + int(key).to_bytes(8, "little", signed=True))
        parent = digest.digest()
        hashes.append(parent)
    return hashes


def prompt_keys(input_ids: torch.Tensor, multimodal: torch.Tensor | None = None,
                content: dict[str, Any] | None = None) -> list[int | bytes]:
    """Each position's key for ``block_hashes`` of a prompt ``input_ids`` [T]: its token id, or where
    ``multimodal`` [T] is set (an image, audio or video placeholder) a digest of the prompt's media ``content`` (the
    processor's tensors, as bytes) and the position: two prompts share a block only if their media are the same."""
    ids = input_ids.tolist()
    if multimodal is None or not bool(multimodal.any()):
        return ids
    digest = hashlib.blake2b(digest_size=16)
    for name, value in sorted((content or {}).items()):
        if torch.is_tensor(value):
            digest.update(name.encode() + str(tuple(value.shape)).encode() + str(value.dtype).encode())
            digest.update(value.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
    media = digest.digest()
    return [media + position.to_bytes(4, "little") if bool(flag) else token
            for position, (token, flag) in enumerate(zip(ids, multimodal.tolist(), strict=True))]


def model_shape(text_config: Any) -> tuple[int, int, int]:
    """(layers, kv heads, head dim) of a transformers decoder config."""
    heads = int(getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads)
    dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    return int(text_config.num_hidden_layers), heads, int(dim)


def token_bytes(text_config: Any, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token takes in every layer."""
    layers, heads, dim = model_shape(text_config)
    return 2 * layers * heads * dim * torch.empty((), dtype=dtype).element_size()


def step_activation_bytes(text_config: Any, dtype: torch.dtype, *, step_tokens: int, rows: int,
                          context: int) -> int:
    """An upper estimate of what one step of a decoder holds on its device beside its weights and the KV pool, for
    ``step_tokens`` tokens at most in a step (a prefill piece, or one a row), ``rows`` rows at most and histories of
    ``context`` tokens at most: the hidden states, projections and MLP of the step's tokens, one layer's history
    gathered from the pool for every row, the attention mask and the last tokens' float32 logits. What the KV budget
    keeps free on a GPU (a workspace or a kernel needs more, never less); exact figures vary with the attention
    kernel, which is why a deploy can set ``kv_cache_bytes`` itself."""
    size = torch.empty((), dtype=dtype).element_size()
    layers, kv_heads, head_dim = model_shape(text_config)
    hidden = int(text_config.hidden_size)
    heads = int(text_config.num_attention_heads)
    experts = int(getattr(text_config, "num_experts_per_tok", 0) or 0)
    moe = int(getattr(text_config, "moe_intermediate_size", 0) or 0) * max(1, experts)
    inner = max(int(getattr(text_config, "intermediate_size", 0) or 0), moe)
    vocab = int(getattr(text_config, "vocab_size", 0) or 0)
    tokens = max(step_tokens, rows)
    per_token = (6 * hidden + 2 * (heads + 2 * kv_heads) * head_dim + 3 * inner) * size
    gathered = max(rows, 1) * context * kv_heads * head_dim * 2 * size  # keys and values of one layer, every row
    mask = max(step_tokens * context, rows * context) * size
    logits = 2 * rows * vocab * 4
    return tokens * per_token + gathered + mask + logits

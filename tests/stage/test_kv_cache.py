"""The paged KV cache on its own: reservations against the budget, rows of different lengths in one step, undo."""

from __future__ import annotations

import pytest
import torch

from omnipipe.stage.kv_cache import KVBudgetError, PagedKVCache


def cache(blocks: int = 4) -> PagedKVCache:
    return PagedKVCache(num_layers=1, kv_heads=1, head_dim=2, num_blocks=blocks, block_tokens=4)


def test_reservations_fill_the_pool_and_come_back_when_released() -> None:
    kv = cache()
    assert kv.reserve("a", 8) and kv.reserve("b", 5)  # 2 blocks each
    assert not kv.reserve("c", 1) and kv.free_blocks == 0  # waits: nothing is free now
    with pytest.raises(KVBudgetError, match="raise kv_cache_bytes"):
        kv.reserve("d", 17)  # more than the whole pool: it can never fit
    kv.release("a")
    assert kv.free_blocks == 2 and kv.reserve("c", 8)


def test_each_row_sees_its_own_history_and_nothing_past_it() -> None:
    kv = cache(blocks=8)
    for key, tokens in (("short", 2), ("long", 6)):
        kv.reserve(key, tokens + 1)
        kv.bind([key], tokens)
        values = torch.full((1, 1, tokens, 2), float(len(key)))
        kv.update(values, values, 0)
    kv.bind(["short", "long"], 1)
    new = torch.tensor([[[[-1.0, -1.0]]], [[[-2.0, -2.0]]]])
    keys, _ = kv.update(new, new, 0)
    assert keys.shape == (2, 1, 8, 2)  # the longest row's 7 tokens, padded to its whole blocks (4 tokens each)
    assert keys[0, 0, :3, 0].tolist() == [5.0, 5.0, -1.0] and keys[1, 0, :7, 0].tolist() == [4.0] * 6 + [-2.0]
    assert keys[0, 0, 3:, 0].tolist() == [0.0] * 5 and keys[1, 0, 7, 0] == 0.0  # the padding row, zero
    mask = kv.attention_mask()
    assert (mask[0, 0, 0, :3] == 0).all() and (mask[0, 0, 0, 3:] < -1e30).all()  # the short row's padding
    assert (mask[1, 0, 0, :7] == 0).all() and (mask[1, 0, 0, 7:] < -1e30).all()
    assert kv.positions().tolist() == [[2], [6]]


def test_a_step_is_undone_by_setting_the_length_back() -> None:
    kv = cache()
    kv.reserve("a", 8)
    kv.bind(["a"], 3)
    kv.set_length("a", 1)
    assert kv.length("a") == 1
    with pytest.raises(ValueError):
        kv.set_length("a", 2)  # only back
    kv.bind(["a"], 7)
    with pytest.raises(KVBudgetError, match="past the KV it reserved"):
        kv.bind(["a"], 1)


def test_a_nan_in_one_requests_cache_leaves_its_batch_mates_finite() -> None:
    """The short row's padding must not read the long row's blocks: a NaN there would make the short row NaN
    through its masked (zero-weight) positions."""
    kv = cache(blocks=8)
    for key, tokens in (("poisoned", 6), ("healthy", 2)):
        kv.reserve(key, tokens + 1)
        kv.bind([key], tokens)
        fill = float("nan") if key == "poisoned" else 1.0
        kv.update(torch.full((1, 1, tokens, 2), fill), torch.full((1, 1, tokens, 2), fill), 0)
    kv.bind(["poisoned", "healthy"], 1)
    new = torch.ones(2, 1, 1, 2)
    keys, values = kv.update(new, new, 0)
    out = torch.nn.functional.scaled_dot_product_attention(new, keys, values, attn_mask=kv.attention_mask())
    eager = torch.softmax(new @ keys.transpose(-1, -2) + kv.attention_mask(), dim=-1) @ values
    assert out[0].isnan().all() and torch.isfinite(out[1]).all() and torch.isfinite(eager[1]).all()
    assert torch.equal(out[1], torch.ones(1, 1, 2))


class _CopiesToTheDevice(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the copies of host tensors to another device (here the meta device, which holds shapes only: a CPU
    box has no second device, and a copy from the CPU to the CPU is no copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's signature
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            sources = [a for a in args if isinstance(a, torch.Tensor)]
            if any(s.device.type == "cpu" for s in sources) and isinstance(out, torch.Tensor) \
                    and out.device.type != "cpu":
                self.copies += 1
        return out


def test_a_bound_step_reaches_the_device_in_one_copy() -> None:
    """Slots, writes, mask, positions and block tables are built where the pool is, from one host -> device copy
    of each row's start and blocks (before: a copy each, a mask built on the host)."""
    kv = PagedKVCache(num_layers=2, kv_heads=1, head_dim=2, num_blocks=8, block_tokens=4, device="meta")
    kv.reserve("a", 10)
    kv.reserve("b", 6)
    kv.bind(["a"], 5)  # a prefill, before the counting
    with _CopiesToTheDevice() as counted:
        kv.bind(["a", "b"], 1, rows=4, width=12)
        kv.step_inputs()
        kv.positions()
        kv.paged_step()
        for layer in range(2):
            kv.update(torch.zeros(4, 1, 1, 2, device="meta"), torch.zeros(4, 1, 1, 2, device="meta"), layer)
    assert counted.copies == 1


def test_the_device_built_step_reads_each_rows_slots_and_writes_past_them() -> None:
    kv = cache(blocks=8)
    kv.reserve("a", 9)  # blocks 7, 6, 5 (taken from the top)
    kv.reserve("b", 3)
    kv.bind(["a", "b"], 2, rows=3, width=8)
    step = kv.paged_step()
    a, b = step.block_tables[0].tolist(), step.block_tables[1].tolist()
    assert step.block_tables[2].tolist() == [-1] * len(a)  # the padding row holds none
    assert step.slots[0, :2].tolist() == [a[0] * 4, a[0] * 4 + 1] and step.slots[1, :2].tolist() == [b[0] * 4,
                                                                                                      b[0] * 4 + 1]
    assert (step.slots[:, 2:] == kv.pad_slot).all() and (step.slots[2] == kv.pad_slot).all()
    assert kv._bound is not None and kv._bound.writes.tolist() == [a[0] * 4, a[0] * 4 + 1, b[0] * 4, b[0] * 4 + 1,
                                                                    kv.scratch_slot, kv.scratch_slot]
    assert step.lengths.tolist() == [2, 2, 2] and kv.positions().tolist() == [[0, 1], [0, 1], [0, 1]]


def _written(kv: PagedKVCache, key: str, tokens: int, prompt: list[int]) -> None:
    """Request ``key`` reserved for ``tokens`` tokens (sharing what the index holds of ``prompt``) and its prompt
    written past what it shares."""
    from omnipipe.stage.kv_cache import block_hashes

    assert kv.reserve(key, tokens, prompt_tokens=len(prompt), hashes=block_hashes(prompt, kv.block_tokens))
    fed = len(prompt) - kv.length(key)
    kv.bind([key], fed)
    values = torch.ones(1, 1, fed, 2)
    kv.update(values, values, 0)


def test_a_replys_blocks_serve_a_prompt_that_repeats_it_once_its_hashes_are_given() -> None:
    from omnipipe.stage.kv_cache import block_hashes

    kv = cache(blocks=8)
    prompt, reply = list(range(6)), [100, 101, 102, 103]
    _written(kv, "turn-1", 12, prompt)
    kv.bind(["turn-1"], 4)  # the reply's tokens through the model
    kv.update(torch.ones(1, 1, 4, 2), torch.ones(1, 1, 4, 2), 0)
    with pytest.raises(ValueError, match="do not begin with its prompt's"):
        kv.extend_hashes("turn-1", block_hashes([9, *prompt[1:], *reply], 4))
    kv.extend_hashes("turn-1", block_hashes(prompt + reply, 4))
    kv.release("turn-1")
    _written(kv, "turn-2", 16, prompt + reply + [7, 8])
    assert kv.shared_tokens("turn-2") == 8  # both full blocks of prompt and reply
    kv.release("turn-2")
    _written(kv, "no-reply", 16, prompt + [55, 56, 57, 58])
    assert kv.shared_tokens("no-reply") == 4  # the prompt's first block only


def test_max_cached_blocks_forgets_the_least_recently_released_beyond_it() -> None:
    kv = PagedKVCache(num_layers=1, kv_heads=1, head_dim=2, num_blocks=8, block_tokens=4, max_cached_blocks=2)
    for first in (1, 2, 3):
        _written(kv, f"r{first}", 5, [first] * 5)  # one full block each, indexed once released
        kv.release(f"r{first}")
        assert kv.cached_blocks() <= 2
    assert kv.cached_blocks() == 2 and kv.free_blocks == 8
    for first, shared in ((1, 0), (2, 4), (3, 4)):  # the first released is forgotten
        _written(kv, f"again{first}", 5, [first] * 5)
        assert kv.shared_tokens(f"again{first}") == shared
        kv.release(f"again{first}", written=False)
    none_kept = PagedKVCache(num_layers=1, kv_heads=1, head_dim=2, num_blocks=4, block_tokens=4, max_cached_blocks=0)
    _written(none_kept, "held", 5, [1] * 5)
    none_kept.index_written("held")  # held for good: its blocks are shared while it holds them
    _written(none_kept, "reader", 5, [1] * 5)
    assert none_kept.shared_tokens("reader") == 4 and none_kept.holders() == ["held", "reader"]
    none_kept.release("reader")
    none_kept.release("held")
    assert none_kept.cached_blocks() == 0 and none_kept.free_blocks == 4

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

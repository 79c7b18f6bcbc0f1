"""Automatic prefix caching in the paged KV cache on its own: chained block hashes, blocks shared by reference
count with the prompt's last token left to compute, freed blocks kept (least recently used taken back first),
extras (a later stage's hidden states) travelling with their blocks, and what a failed step wrote never shared."""

from __future__ import annotations

import pytest
import torch

from omnipipe.stage.kv_cache import PagedKVCache, block_hashes, prompt_keys

BLOCK = 4


def cache(blocks: int = 8) -> PagedKVCache:
    return PagedKVCache(num_layers=1, kv_heads=1, head_dim=2, num_blocks=blocks, block_tokens=BLOCK)


def prefill(kv: PagedKVCache, key: str, prompt: list[int], extra: int = 4, **options: object) -> int:
    """Reserve ``key``'s prompt (and ``extra`` tokens), write the prompt's tokens past what it shares (each value:
    the token id), and return how many it shared."""
    assert kv.reserve(key, len(prompt) + extra, prompt_tokens=len(prompt),
                      hashes=block_hashes(prompt, BLOCK), **options)
    start = kv.length(key)
    kv.bind([key], len(prompt) - start)
    values = torch.tensor(prompt[start:], dtype=torch.float32).view(1, 1, -1, 1).expand(1, 1, -1, 2)
    kv.update(values, values, 0)
    return start


def history(kv: PagedKVCache, key: str) -> list[float]:
    """What the next step of ``key`` attends to (its whole history, as values)."""
    kv.bind([key], 1)
    keys, _ = kv.update(torch.full((1, 1, 1, 2), -1.0), torch.full((1, 1, 1, 2), -1.0), 0)
    kv.set_length(key, kv.length(key) - 1)
    return keys[0, 0, : kv.length(key), 0].tolist()


def test_block_hashes_chain_every_position_before_them() -> None:
    a = block_hashes(list(range(10)), BLOCK)
    assert len(a) == 2  # the last 2 tokens fill no block
    assert block_hashes(list(range(8)), BLOCK) == a
    changed = block_hashes([99, *range(1, 10)], BLOCK)
    assert changed[0] != a[0] and changed[1] != a[1]  # block 1's tokens are equal, its prefix is not
    assert block_hashes([0, 1, 2, 3, 4, 5, 6, 99], BLOCK)[0] == a[0]


def test_media_enter_the_keys_through_their_content() -> None:
    ids = torch.tensor([1, 2, 7, 7, 3, 4])
    image = torch.arange(12, dtype=torch.float32)
    mm = ids == 7
    same = prompt_keys(ids, mm, {"pixel_values": image.clone()})
    assert same == prompt_keys(ids, mm, {"pixel_values": image})
    assert same[:2] == [1, 2] and same[4:] == [3, 4] and isinstance(same[2], bytes) and same[2] != same[3]
    other = prompt_keys(ids, mm, {"pixel_values": image + 1})
    assert other[2] != same[2] and other[:2] == same[:2]
    assert prompt_keys(ids) == [1, 2, 7, 7, 3, 4]


def test_a_second_request_shares_the_blocks_of_its_common_prefix_and_computes_the_rest() -> None:
    kv = cache()
    first = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    assert prefill(kv, "a", first) == 0
    second = [10, 11, 12, 13, 14, 15, 16, 17, 50, 51, 52]
    kv.bind(["a"], 1)  # a's next step indexes what its prefill wrote
    kv.set_length("a", 10)
    assert prefill(kv, "b", second) == 8  # two whole blocks
    assert kv.shared_tokens("b") == 8
    assert kv._entries["b"].blocks[:2] == kv._entries["a"].blocks[:2]  # the same blocks, not copies
    assert history(kv, "b") == [float(t) for t in second]
    assert kv.prefix_queries == 21 and kv.prefix_hits == 8


def test_the_last_token_is_always_computed() -> None:
    kv = cache()
    prompt = list(range(8))  # exactly two blocks
    prefill(kv, "a", prompt)
    kv.release("a")
    assert prefill(kv, "b", prompt) == 4  # the second block holds the last token: computed again, in its own block
    assert history(kv, "b") == [float(t) for t in prompt]


def test_freed_blocks_keep_their_kv_until_the_pool_needs_them_least_recently_used_first() -> None:
    kv = cache(blocks=6)
    for key, base in (("a", 0), ("b", 100)):
        prefill(kv, key, [base + i for i in range(9)], extra=3)  # 3 blocks, 2 of them full prompt blocks
        kv.release(key)
    assert kv.free_blocks == 6 and kv.cached_blocks() == 4
    assert prefill(kv, "a2", list(range(9)), extra=3) == 8  # a's prompt is still there
    kv.release("a2")
    prefill(kv, "c", [200 + i for i in range(13)], extra=3)  # 4 blocks: 2 empty ones and b's 2 cached ones
    assert kv.cached_blocks() == 2
    kv.release("c")
    assert prefill(kv, "a3", list(range(9)), extra=3) == 8  # a's, used more recently, were not taken
    kv.release("a3")
    assert prefill(kv, "b2", [100 + i for i in range(9)], extra=3) == 0  # b's were taken back and forgotten


def test_a_shared_block_stays_until_every_holder_releases_it() -> None:
    kv = cache(blocks=4)
    prompt = list(range(9))
    prefill(kv, "a", prompt, extra=0)
    kv.release("a")
    prefill(kv, "b", prompt, extra=0)
    prefill(kv, "c", prompt, extra=0)
    assert kv._entries["b"].blocks[:2] == kv._entries["c"].blocks[:2]
    kv.release("b")
    assert history(kv, "c") == [float(t) for t in prompt]  # c still reads the shared blocks
    with pytest.raises(ValueError, match="shared"):
        kv.set_length("c", 4)  # a step is never undone into a shared block


def test_what_a_failed_first_step_wrote_is_not_shared() -> None:
    kv = cache()
    prompt = list(range(9))
    assert kv.reserve("a", 12, prompt_tokens=9, hashes=block_hashes(prompt, BLOCK))
    kv.bind(["a"], 9)  # the forward then fails: nothing of it may be trusted
    kv.release("a", written=False)
    assert kv.cached_blocks() == 0 and prefill(kv, "b", prompt) == 0


def test_a_family_that_needs_extras_shares_only_blocks_that_have_them() -> None:
    kv = cache()
    prompt = list(range(9))
    prefill(kv, "a", prompt, needs_extras=True)
    kv.release("a")  # it never gave its extras: nothing was indexed
    assert prefill(kv, "b", prompt, needs_extras=True) == 0
    kv.set_extras("b", {0: torch.arange(9.0).view(9, 1)})
    kv.release("b")
    assert prefill(kv, "c", prompt, needs_extras=True) == 8
    assert kv.prefix_extras("c")[0].view(-1).tolist() == [float(i) for i in range(8)]
    kv.release("c")
    assert prefill(kv, "d", prompt) == 8  # a family without extras may share them too


def test_prefix_caching_off_shares_nothing() -> None:
    kv = PagedKVCache(num_layers=1, kv_heads=1, head_dim=2, num_blocks=8, block_tokens=BLOCK, prefix_caching=False)
    prompt = list(range(9))
    prefill(kv, "a", prompt)
    kv.release("a")
    assert prefill(kv, "b", prompt) == 0 and kv.cached_blocks() == 0 and kv.prefix_queries == 0

"""Tests of tensor-parallel decoding: two ranks (processes talking gloo over loopback) against one process on the
same prompts (prefills at different lengths, batched greedy decode, a shared prefix), and the refusal of head
counts that do not split.

This file is also the ranks' program: ``python test_tensor_parallel_decoder.py MODEL RANK WORLD PORT OUT_DIR``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from omnipipe.util.net import free_port

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = ("gemma3-270m", "qwen2.5-coder-0.5b-instruct")
PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village near the mountains, there lived a",
    "def fibonacci(n):",
)
PREFIX = ("You are a helpful assistant. Answer each question briefly and precisely, in one plain sentence, without "
          "lists, tables or code.")  # longer than a KV block: the prompt extending it shares that block
EXTENSION = " Question: What is the largest planet in our solar system? Answer:"
DECODE_STEPS = 8
PREFIX_DECODE_STEPS = 4
WORLD_SIZE = 2
LOGIT_TOLERANCE = 1e-3  # float32; the measured difference is printed
RANK_TIMEOUT_S = 300


def _decoder_class(model: str) -> type:
    if model.startswith("gemma"):
        from omnipipe.models.default.modeling.gemma import GemmaThinker

        return GemmaThinker
    from omnipipe.models.default.modeling.qwen2 import Qwen2Thinker

    return Qwen2Thinker


def _model_dir(model: str) -> Path:
    from omnipipe.models.default.weights.thinker import prepare_thinker

    return prepare_thinker(model, progress=False)


def _scenario(decoder: Any, share: Callable[[list[int]], list[int]]) -> dict[str, Any]:
    """Greedy decoding of several requests together, then of a prompt extending a shared prefix. Rank 0 picks the
    tokens (``share`` hands them to every rank); every rank asks for logits (each scores its vocabulary slice),
    only rank 0 gets them."""
    lead = decoder.rank == 0
    logits: list[torch.Tensor] = []  # per forward: [requests, vocab] (rank 0)
    tokens: list[list[int]] = []
    skipped: list[bool] = []  # a follower's calls returned None

    def record(out: torch.Tensor | None) -> None:
        if lead:
            logits.append(out.clone())
        else:
            skipped.append(out is None)

    def greedy() -> list[int]:
        picked = share(logits[-1].argmax(-1).tolist() if lead else [0] * len(request_ids))
        tokens.append(picked)
        return picked

    prompts = [decoder.tokenizer(text).input_ids for text in PROMPTS]
    assert len({len(p) for p in prompts}) == len(prompts)  # the batch decodes at different positions
    request_ids = [f"prompt-{i}" for i in range(len(prompts))]
    first = [decoder.prefill(rid, ids) for rid, ids in zip(request_ids, prompts, strict=True)]
    record(torch.stack(first) if lead else (None if all(f is None for f in first) else first[0]))
    for _ in range(DECODE_STEPS):
        record(decoder.decode(request_ids, greedy()))
    kv_cache_bytes = decoder.kv_cache_bytes()
    for rid in request_ids:
        decoder.free(rid)

    from omnipipe.models.default.modeling.decoder import DEFAULT_KV_CACHE_TOKENS

    prefix = decoder.tokenizer(PREFIX).input_ids
    extended = prefix + decoder.tokenizer(EXTENSION, add_special_tokens=False).input_ids
    decoder.use_kv_cache(DEFAULT_KV_CACHE_TOKENS, prefix_caching=True)
    decoder.prefill("prefix", prefix, logits=False)
    decoder.free("prefix")  # its full blocks stay for the prompt that extends it
    request_ids = ["extended"]
    out = decoder.prefill("extended", extended)
    block = decoder.kv.block_tokens
    shared = decoder.kv.shared_tokens("extended")
    tables = decoder.kv._entries["extended"].blocks  # every rank's must be the same
    record(out[None] if out is not None else None)
    for _ in range(PREFIX_DECODE_STEPS):
        record(decoder.decode(request_ids, greedy()))
    decoder.free("extended")
    decoder.use_kv_cache(DEFAULT_KV_CACHE_TOKENS)
    return {"logits": logits, "tokens": tokens, "skipped": skipped, "kv_cache_bytes": kv_cache_bytes,
            "prefix_used": shared == len(prefix) // block * block > 0, "blocks": list(tables)}


def _rank_main(model: str, rank: int, world_size: int, port: int, out_dir: Path) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=RANK_TIMEOUT_S))
    try:
        decoder = _decoder_class(model)(_model_dir(model), num_threads=1, rank=rank, world_size=world_size)

        def share(tokens: list[int]) -> list[int]:
            picked = torch.tensor(tokens, dtype=torch.long)
            dist.broadcast(picked, src=0)
            return picked.tolist()

        result = _scenario(decoder, share)
        result["local_kv_heads"] = decoder._kv_heads
        result["lm_head_rows"], result["vocab_size"] = decoder._lm_head.shape[0], decoder.vocab_size
        torch.save(result, out_dir / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _run_ranks(model: str, out_dir: Path) -> list[dict[str, Any]]:
    import omnipipe

    source = str(Path(omnipipe.__file__).resolve().parents[1])  # the omnipipe under test, not an installed one
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    port = free_port()
    logs = [out_dir / f"rank{rank}.log" for rank in range(WORLD_SIZE)]
    procs = []
    for rank in range(WORLD_SIZE):
        with logs[rank].open("wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, __file__, model, str(rank), str(WORLD_SIZE), str(port), str(out_dir)],
                env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + RANK_TIMEOUT_S
    try:
        codes = [proc.wait(timeout=max(1.0, deadline - time.monotonic())) for proc in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if codes != [0] * WORLD_SIZE:
        output = "\n".join(f"--- rank {rank} ---\n{log.read_text(errors='replace')[-4000:]}"
                           for rank, log in enumerate(logs))
        pytest.fail(f"tensor-parallel ranks exited with {codes or 'a timeout'}:\n{output}")
    return [torch.load(out_dir / f"rank{rank}.pt") for rank in range(WORLD_SIZE)]


@pytest.fixture(scope="module", params=MODELS)
def runs(request, tmp_path_factory) -> dict[str, Any]:
    """One process (counting all-reduce calls) and then the ranks, on the same scenario."""
    import torch.distributed as dist

    model = request.param
    reduces = []
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(*args: Any, **kwargs: Any) -> Any:
        reduces.append(1)
        return real_all_reduce(*args, **kwargs)

    decoder = _decoder_class(model)(_model_dir(model), num_threads=1)
    dist.all_reduce = counting_all_reduce
    try:
        single = _scenario(decoder, lambda tokens: tokens)
    finally:
        dist.all_reduce = real_all_reduce
    total_kv_heads = decoder.config.num_kv_heads
    del decoder
    ranks = _run_ranks(model, tmp_path_factory.mktemp(f"tp-{model}"))
    return {"model": model, "single": single, "ranks": ranks, "all_reduces": len(reduces),
            "total_kv_heads": total_kv_heads}


@pytest.mark.models
def test_two_ranks_give_the_logits_of_one_process(runs) -> None:
    single, lead = runs["single"], runs["ranks"][0]
    assert len(lead["logits"]) == len(single["logits"]) == 2 + DECODE_STEPS + PREFIX_DECODE_STEPS
    worst = max(float((a - b).abs().max()) for a, b in zip(lead["logits"], single["logits"], strict=True))
    print(f"{runs['model']}: max |logit difference| TP={WORLD_SIZE} vs TP=1: {worst:.3g}")
    assert worst < LOGIT_TOLERANCE


@pytest.mark.models
def test_two_ranks_pick_the_greedy_tokens_of_one_process(runs) -> None:
    single, lead = runs["single"], runs["ranks"][0]
    assert single["prefix_used"] and lead["prefix_used"]  # the extended prompt ran on the shared prefix's cache
    assert all(rank["blocks"] == lead["blocks"] for rank in runs["ranks"])  # the ranks' block tables agree
    assert lead["tokens"] == single["tokens"]
    assert all(rank["tokens"] == single["tokens"] for rank in runs["ranks"][1:])  # what the followers were fed


@pytest.mark.models
def test_only_rank_0_gets_logits_and_each_rank_caches_only_its_kv_heads(runs) -> None:
    for rank in runs["ranks"][1:]:
        assert rank["skipped"] and all(rank["skipped"]) and rank["logits"] == []
    expected_kv_heads = max(1, runs["total_kv_heads"] // WORLD_SIZE)  # split, or one replicated
    for rank in runs["ranks"]:
        assert rank["local_kv_heads"] == expected_kv_heads
        assert rank["lm_head_rows"] == rank["vocab_size"] // WORLD_SIZE  # its slice of the vocabulary
        assert rank["kv_cache_bytes"] * runs["total_kv_heads"] == runs["single"]["kv_cache_bytes"] * expected_kv_heads


@pytest.mark.models
def test_one_process_makes_no_all_reduce(runs) -> None:
    assert runs["all_reduces"] == 0


@pytest.mark.models
@pytest.mark.parametrize(("model", "world_size", "message"), [
    ("qwen2.5-coder-0.5b-instruct", 3, "world_size 3 does not divide the 14 attention heads"),
    ("qwen2.5-coder-0.5b-instruct", 7, "splits the groups of 7 query heads .* inconsistently"),
    ("gemma3-270m", 8, "world_size 8 does not divide the 4 attention heads"),
    ("gemma3-270m", 2, "needs an initialised torch.distributed"),  # a valid split, but no process group
])
def test_a_world_size_the_heads_cannot_be_split_over_is_refused(model: str, world_size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _decoder_class(model)(_model_dir(model), rank=world_size - 1, world_size=world_size)


class _Sharding:
    """Just enough of a decoder to run the head-sharding arithmetic."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def shard(self, heads: int, kv_heads: int) -> tuple[int, int, int, int]:
        from omnipipe.models.default.modeling.decoder import CachedDecoder

        CachedDecoder._shard_attention(self, heads, kv_heads)  # type: ignore[arg-type]
        return self._heads, self._head_start, self._kv_heads, self._kv_head_start  # type: ignore[attr-defined]


@pytest.mark.parametrize(("heads", "kv_heads", "world_size", "expected"), [
    (14, 2, 1, [(14, 0, 2, 0)]),
    (14, 2, 2, [(7, 0, 1, 0), (7, 7, 1, 1)]),  # Qwen2.5 0.5B: the KV heads split
    (4, 1, 2, [(2, 0, 1, 0), (2, 2, 1, 0)]),  # Gemma 3 270M: the one KV head replicated
    (12, 2, 4, [(3, 0, 1, 0), (3, 3, 1, 0), (3, 6, 1, 1), (3, 9, 1, 1)]),  # two ranks per KV head
    (8, 8, 4, [(2, 0, 2, 0), (2, 2, 2, 2), (2, 4, 2, 4), (2, 6, 2, 6)]),
])
def test_each_rank_takes_its_query_heads_and_the_kv_heads_they_use(heads, kv_heads, world_size, expected) -> None:
    assert [_Sharding(rank, world_size).shard(heads, kv_heads) for rank in range(world_size)] == expected


def test_a_rank_spanning_part_of_two_kv_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="inconsistently"):
        _Sharding(0, 3).shard(12, 2)  # 4 heads per rank, groups of 6


if __name__ == "__main__":
    _rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))

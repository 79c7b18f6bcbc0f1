"""``omnipipe bench thinker``: the default pipeline's thinker decoder against llama.cpp and transformers on the same
weights, in one run.

    omnipipe bench thinker [--model qwen2.5-coder-0.5b-instruct] [--threads 2] [--tokens 48] [--batch 8]
                           [--prompt-tokens N]

Backends (each loaded alone, in turn, with the same thread count):

- ``omnipipe float32`` / ``omnipipe int8`` / ``omnipipe int8-split``: ``CachedDecoder`` with each weight format
  (``stages.thinker.options.weights``): float32, ``Int8Linear`` or ``Int8SplitLinear`` projections;
- ``llama.cpp``: llama-cpp-python on the packaged GGUF itself (Q4_K_M, the file the float32 checkpoint was
  dequantised from), driven through its batch API so that several sequences decode in one ``llama_decode``;
- ``transformers``: ``AutoModelForCausalLM`` on the converted float32 checkpoint, ``generate`` with a KV cache.

Per backend: prefill ms of one whole prompt (no prefix cache; ``--prompt-tokens N``: the first question after
requests for long answers, about N tokens in all, so that prefill is timed on a longer prompt; that prompt is also
the one decoded alone and the first of the batch), decode tok/s at batch 1, aggregate decode tok/s with
``--batch`` sequences decoding together (every sequence prefilled first, then ``--tokens`` steps of all of them;
transformers pads the batch), and the greedy answer to the first question. Every backend decodes exactly
``--tokens`` tokens (an end-of-turn token does not stop the timing run), so they do the same work. The last line
reads ``llama.cpp / omnipipe decode time at batch 1: X.XX`` (the default pipeline's weight format; else int8, else
float32, whichever was run), the fraction of our decode time llama.cpp needs: 1.00 is parity, 0.50 means llama.cpp
is twice as fast.

llama.cpp is an optional install (``pip install llama-cpp-python==0.3.36``, built from source: ~10-20 minutes on two
cores); without it its rows say so and the ratio is not printed.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnipipe.bench.prompts import LONG_QUESTIONS, QUESTIONS
from omnipipe.bench.report import format_table, machine_info, write_json
from omnipipe.models.default.modeling.quantized import WEIGHT_FORMATS

MAX_PROMPT_TOKENS = 2048  # the thinker stage's own limit (runners/thinker.py)
BACKENDS = (*(f"omnipipe-{weights}" for weights in WEIGHT_FORMATS), "llama.cpp", "transformers")
LLAMA_CPP_INSTALL = "pip install llama-cpp-python==0.3.36"


@dataclass
class Result:
    backend: str
    prefill_ms: float | None = None
    prompt_tokens: int = 0
    decode_tok_s: float | None = None
    batch_tok_s: float | None = None
    answer: str = ""
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _prompts(model: str, tokenizer: Any, batch: int, prompt_tokens: int = 0) -> list[list[int]]:
    """The chat prompts of the first ``batch`` questions, tokenised as the thinker stage does; with
    ``prompt_tokens``, the first one's question follows requests for long answers, to at least that many tokens."""
    from omnipipe.models.default.runners.thinker import thinker_model

    prompt_format = thinker_model(model).prompt_format()
    preamble = tokenizer.encode(prompt_format.preamble())
    questions = list(QUESTIONS[:batch])
    for index in itertools.count():
        if len(preamble + prompt_format.encode_turns(tokenizer, questions[0])) >= prompt_tokens:
            break
        questions[0] = f"{LONG_QUESTIONS[index % len(LONG_QUESTIONS)]} {questions[0]}"
    return [preamble + prompt_format.encode_turns(tokenizer, q) for q in questions]


def _answer(tokenizer: Any, ids: list[int], stops: frozenset[int]) -> str:
    cut = next((i for i, t in enumerate(ids) if t in stops), len(ids))
    return tokenizer.decode(ids[:cut], skip_special_tokens=True).strip()


def _bench_omnipipe(model: str, weights: str, threads: int, tokens: int, batch: int, prompt_tokens: int) -> Result:
    from omnipipe.models.default.runners.thinker import thinker_model
    from omnipipe.models.default.weights.thinker import prepare_thinker

    decoder = thinker_model(model).decoder(prepare_thinker(model), num_threads=threads, weights=weights)
    prompts = _prompts(model, decoder.tokenizer, batch, prompt_tokens)
    result = Result(f"omnipipe {weights}", prompt_tokens=len(prompts[0]))
    decoder.prefill("warm", prompts[0][:8])
    decoder.decode(["warm"], [0])
    decoder.free("warm")
    started = time.perf_counter()
    logits = decoder.prefill("one", prompts[0])
    result.prefill_ms = (time.perf_counter() - started) * 1e3
    generated: list[int] = []
    started = time.perf_counter()
    for _ in range(tokens):
        generated.append(int(logits.argmax()))
        logits = decoder.decode(["one"], [generated[-1]])[0]
    result.decode_tok_s = tokens / (time.perf_counter() - started)
    result.answer = _answer(decoder.tokenizer, generated, decoder.eos_token_ids)
    decoder.free("one")
    ids = [f"r{i}" for i in range(batch)]
    last = [int(decoder.prefill(rid, prompt).argmax()) for rid, prompt in zip(ids, prompts, strict=True)]
    started = time.perf_counter()
    for _ in range(tokens):
        last = decoder.decode(ids, last).argmax(dim=-1).tolist()
    result.batch_tok_s = batch * tokens / (time.perf_counter() - started)
    result.extra["weight_mb"] = round(decoder.weight_bytes() / 1e6)
    return result


def _bench_llama_cpp(model: str, threads: int, tokens: int, batch: int, prompt_tokens: int) -> Result:
    try:
        import llama_cpp
    except ImportError as error:
        return Result("llama.cpp", note=f"not installed ({LLAMA_CPP_INSTALL}): {error}")
    from transformers import AutoTokenizer

    from omnipipe.models.default.weights.thinker import prepare_thinker, thinker_gguf

    # our tokenizer, so every backend reads the same token ids (the GGUF's vocabulary is the same one)
    tokenizer = AutoTokenizer.from_pretrained(str(prepare_thinker(model)), local_files_only=True)
    prompts = _prompts(model, tokenizer, batch, prompt_tokens)
    context = 512 * batch + prompt_tokens
    # the model through the high-level class; a context of our own, which the class would not give several
    # sequences
    llm = llama_cpp.Llama(str(thinker_gguf(model, progress=False)), n_ctx=64, n_threads=threads, verbose=False)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = context, 512, 512
    params.n_seq_max, params.kv_unified = batch, True
    params.n_threads, params.n_threads_batch = threads, threads
    ctx, vocab = llama_cpp.llama_init_from_model(llm.model, params), llm.n_vocab()
    if not ctx:
        llm.close()
        return Result("llama.cpp", note="llama_init_from_model failed")
    memory = llama_cpp.llama_get_memory(ctx)
    stops = frozenset(int(t) for t in (llm.token_eos(), *_eos_ids(tokenizer)))
    lot = llama_cpp.llama_batch_init(max(512, batch), 0, batch)

    def run(entries: list[tuple[int, int, int, bool]]) -> None:  # (token, position, sequence, wants logits)
        lot.n_tokens = len(entries)
        for i, (token, position, sequence, logits) in enumerate(entries):
            lot.token[i], lot.pos[i], lot.n_seq_id[i] = token, position, 1
            lot.seq_id[i][0], lot.logits[i] = sequence, logits
        code = llama_cpp.llama_decode(ctx, lot)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")

    def greedy(index: int) -> int:
        return int(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(vocab,)).argmax())

    def prefill(prompt: list[int], sequence: int) -> int:
        """Run a prompt in chunks of 512; the greedy next token."""
        for start in range(0, len(prompt), 512):
            part = prompt[start : start + 512]
            run([(t, start + i, sequence, start + i == len(prompt) - 1) for i, t in enumerate(part)])
        return greedy(len(part) - 1)

    try:
        result = Result("llama.cpp (Q4_K_M)", prompt_tokens=len(prompts[0]))
        prefill(prompts[0][:8], 0)
        llama_cpp.llama_memory_clear(memory, True)
        started = time.perf_counter()
        token = prefill(prompts[0], 0)
        result.prefill_ms = (time.perf_counter() - started) * 1e3
        generated, position = [], len(prompts[0])
        started = time.perf_counter()
        for _ in range(tokens):
            generated.append(token)
            run([(token, position, 0, True)])
            token, position = greedy(0), position + 1
        result.decode_tok_s = tokens / (time.perf_counter() - started)
        result.answer = _answer(tokenizer, generated, stops)
        llama_cpp.llama_memory_clear(memory, True)
        last = [prefill(prompt, s) for s, prompt in enumerate(prompts)]
        positions = [len(p) for p in prompts]
        started = time.perf_counter()
        for _ in range(tokens):
            run([(last[s], positions[s], s, True) for s in range(batch)])
            last = [greedy(s) for s in range(batch)]
            positions = [p + 1 for p in positions]
        result.batch_tok_s = batch * tokens / (time.perf_counter() - started)
        return result
    finally:
        llama_cpp.llama_batch_free(lot)
        llama_cpp.llama_free(ctx)
        llm.close()


def _eos_ids(tokenizer: Any) -> list[int]:
    return [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]


def _bench_transformers(model: str, threads: int, tokens: int, batch: int, prompt_tokens: int) -> Result:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omnipipe.models.default.weights.thinker import prepare_thinker

    torch.set_num_threads(threads)
    directory = str(prepare_thinker(model))
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    lm = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32).eval()
    prompts = _prompts(model, tokenizer, batch, prompt_tokens)
    result = Result("transformers float32", prompt_tokens=len(prompts[0]))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def generate(batch_prompts: list[list[int]], new_tokens: int, exact: bool = True) -> tuple[Any, float]:
        """``exact``: exactly ``new_tokens`` (an end token is then suppressed: timing only)."""
        width = max(len(p) for p in batch_prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch_prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch_prompts])
        started = time.perf_counter()
        with torch.inference_mode():
            out = lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens if exact else 0, do_sample=False, pad_token_id=pad)
        return out[:, width:], time.perf_counter() - started

    generate([prompts[0][:8]], 2)
    _, prefill_s = generate([prompts[0]], 1)
    result.prefill_ms = prefill_s * 1e3
    _, total_s = generate([prompts[0]], tokens + 1)
    result.decode_tok_s = tokens / max(total_s - prefill_s, 1e-9)
    out, _ = generate([prompts[0]], tokens, exact=False)
    eos = lm.generation_config.eos_token_id
    stops = frozenset(_eos_ids(tokenizer)) | frozenset(eos if isinstance(eos, list) else [eos] if eos else [])
    result.answer = _answer(tokenizer, out[0].tolist(), stops)
    _, batch_prefill_s = generate(prompts, 1)
    _, batch_total_s = generate(prompts, tokens + 1)
    result.batch_tok_s = batch * tokens / max(batch_total_s - batch_prefill_s, 1e-9)
    return result


def _run(backend: str, model: str, threads: int, tokens: int, batch: int, prompt_tokens: int = 0) -> Result:
    if backend.startswith("omnipipe-"):
        return _bench_omnipipe(model, backend.removeprefix("omnipipe-"), threads, tokens, batch, prompt_tokens)
    if backend == "llama.cpp":
        return _bench_llama_cpp(model, threads, tokens, batch, prompt_tokens)
    return _bench_transformers(model, threads, tokens, batch, prompt_tokens)


def _default_weights() -> str:
    """The default pipeline's thinker weight format."""
    from omnipipe.models.default.pipeline import THINKER

    return str(THINKER.default_options["weights"])


def format_report(results: list[Result], batch: int) -> str:
    rows = [[r.backend, r.prompt_tokens or None, r.prefill_ms, r.decode_tok_s, r.batch_tok_s,
             (r.answer[:60] + ("..." if len(r.answer) > 60 else "")) if not r.note else r.note] for r in results]
    table = format_table(["backend", "prompt tok", "prefill ms", "tok/s b=1", f"tok/s b={batch}", "greedy answer"],
                         rows, digits=1)
    lines = [table]
    by_name = {r.backend: r for r in results if r.decode_tok_s}
    ours = next((by_name[name] for name in (f"omnipipe {_default_weights()}", "omnipipe int8", "omnipipe float32")
                 if name in by_name), None)
    llama = next((r for r in results if r.backend.startswith("llama.cpp") and r.decode_tok_s), None)
    if ours is not None and llama is not None:
        if ours.batch_tok_s and llama.batch_tok_s:
            lines.append(f"{ours.backend} / llama.cpp aggregate tok/s at batch {batch}: "
                         f"{ours.batch_tok_s / llama.batch_tok_s:.2f}")
        lines.append(f"llama.cpp / omnipipe decode time at batch 1: {ours.decode_tok_s / llama.decode_tok_s:.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench thinker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="a packaged thinker (omnipipe models)")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--tokens", type=int, default=48, help="decode steps timed per sequence")
    parser.add_argument("--batch", type=int, default=8, help="sequences decoding together")
    parser.add_argument("--prompt-tokens", type=int, default=0,
                        help="time prefill on a prompt of about this many tokens (default: the first question's)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated of: {', '.join(BACKENDS)}")
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        parser.error(f"--backends: unknown {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    for name, value in (("--threads", args.threads), ("--tokens", args.tokens), ("--batch", args.batch)):
        if value < 1:
            parser.error(f"{name} must be at least 1")
    if args.batch > len(QUESTIONS):
        parser.error(f"--batch must be at most {len(QUESTIONS)}")
    if not 0 <= args.prompt_tokens <= MAX_PROMPT_TOKENS:
        parser.error(f"--prompt-tokens must be in [0, {MAX_PROMPT_TOKENS}]")
    from omnipipe.models.default.runners.thinker import thinker_model

    try:
        thinker_model(args.model)
    except ValueError as error:
        parser.error(f"--model: {error}")
    results = []
    for backend in backends:
        results.append(_run(backend, args.model, args.threads, args.tokens, args.batch, args.prompt_tokens))
        gc.collect()
    print(f"thinker {args.model}, {args.threads} threads, {args.tokens} greedy tokens per sequence")
    print(format_report(results, args.batch))
    if args.json:
        write_json(args.json, {"machine": machine_info(), "model": args.model, "threads": args.threads,
                               "tokens": args.tokens, "batch": args.batch, "prompt_tokens": args.prompt_tokens,
                               "results": [r.__dict__ for r in results]})
    return 0

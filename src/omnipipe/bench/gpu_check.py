"""``omnipipe bench gpu-check``: what a first run on a CUDA machine must show, in one command (a few minutes).

Checks, each PASS or FAIL (or measured, or skipped) with what was seen (the tiny Qwen3-Omni thinker, and for the
recompiles its talker too, run in this process by the stage's own scheduler and step, ``stage/runner_driver.py``):

- placement: every parameter and buffer of the loaded thinker, and its KV pool, on the device;
- batched == alone: 4 greedy requests stepped together give the tokens each gives alone (float32, TF32 off);
- NaN isolation: a NaN in one request's KV blocks leaves its batch-mate's attention finite (the device's own
  attention kernel over the paged cache);
- syncs per decode step: the device -> host syncs of the runner's whole decode step (forward and sampling), by
  torch's sync debug mode (CUDA only);
- recompiles after warm-up: with ``torch_compile`` on, graphs compiled by batches of other sizes and prompts after
  the stage's warm-up, the thinker's and then the talker's (fed the thinker's answers); PASS when both are 0 (a
  recompile stalls every stream in the step).

Then the step itself at the released width: Qwen3-Omni's thinker text decoder (its released config, ``--layers``
layers, random bfloat16 weights) over the paged KV cache, a decode step at B rows of ``--context`` tokens of history
each: ms a step, tokens/s, and peak device memory. CUDA graphs are not captured yet: the table says so rather than
showing a figure.

    omnipipe bench gpu-check                       # on a CUDA machine; elsewhere it says so and exits 0
    omnipipe bench gpu-check --device cpu --batches 1,2 --layers 1 --context 64   # the same code on a CPU
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from omnipipe.bench.report import format_table, machine_info, write_json

GREEDY = {"temperature": 0.0, "max_tokens": 12}
PROMPTS = ("hello there", "tell me more about the sea and the stars", "one two three", "what is a cat")


def _runner(checkpoint: Path, device: str, **options: Any) -> Any:
    from omnipipe.models.qwen3_omni.runners.thinker import Qwen3ThinkerRunner
    from omnipipe.stage.runner import RunnerContext

    runner = Qwen3ThinkerRunner(RunnerContext("thinker", device, 1, 8, {"model": str(checkpoint), **options}))
    runner.load()
    return runner


def _arrivals(prompts: Sequence[str], steps: Sequence[int] | None = None) -> list[Any]:
    from omnipipe.stage.runner_driver import Arrival

    chat = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    return [Arrival(f"r{i}", dict(GREEDY), [{"text": chat.format(prompt)}], step=(steps or [0] * len(prompts))[i])
            for i, prompt in enumerate(prompts)]


def _answer(result: Any, request_id: str) -> tuple[str, int]:
    """A driven request's text and how many tokens it made."""
    return result.text(request_id), sum(output.num_units for output in result.outputs[request_id])


@contextmanager
def _exact_float32() -> Any:
    """float32 matmuls without TF32 while inside (the stage process turns TF32 on)."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def check_placement(checkpoint: Path, device: str) -> tuple[str, str]:
    runner = _runner(checkpoint, device)
    want = torch.device(device).type
    tensors = [*runner.model.named_parameters(), *runner.model.named_buffers()]
    off = [name for name, tensor in tensors if tensor.device.type != want]
    pool = {t.device.type for t in (*runner.kv.keys, *runner.kv.values)}
    ok = not off and pool == {want}
    return verdict(ok), (f"{len(tensors)} tensors and the KV pool on {device}" if ok else
                f"off {device}: {', '.join(off[:4]) or 'none'}; KV pool on {sorted(pool)}")


def check_batched_equals_alone(checkpoint: Path, device: str) -> tuple[str, str]:
    from omnipipe.stage.runner_driver import drive

    with _exact_float32():
        runner = _runner(checkpoint, device, dtype="float32")
        together = drive(runner, _arrivals(PROMPTS, [0, 0, 2, 5]))
        alone = [drive(runner, _arrivals([prompt])) for prompt in PROMPTS]
    same = [_answer(together, f"r{i}") == _answer(alone[i], "r0") for i in range(len(PROMPTS))]
    lengths = [_answer(together, f"r{i}")[1] for i in range(len(PROMPTS))]
    return verdict(all(same) and all(lengths)), f"{sum(same)}/{len(same)} requests equal, {lengths} tokens each"


def check_nan_isolation(device: str) -> tuple[str, str]:
    from omnipipe.stage.kv_cache import PagedKVCache

    kv = PagedKVCache(num_layers=1, kv_heads=2, head_dim=64, num_blocks=8, block_tokens=16,
                      dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32, device=device)
    for key, tokens in (("poisoned", 40), ("healthy", 5)):
        kv.reserve(key, tokens + 1)
        kv.bind([key], tokens)
        fill = float("nan") if key == "poisoned" else 0.5
        states = torch.full((1, 2, tokens, 64), fill, dtype=kv.dtype, device=device)
        kv.update(states, states, 0)
    kv.bind(["poisoned", "healthy"], 1)
    new = torch.ones(2, 2, 1, 64, dtype=kv.dtype, device=device)
    keys, values = kv.update(new, new, 0)
    out = torch.nn.functional.scaled_dot_product_attention(new, keys, values, attn_mask=kv.attention_mask())
    healthy = bool(torch.isfinite(out[1]).all())
    return verdict(healthy), "the batch-mate's attention is finite" if healthy else "the NaN reached the batch-mate"


def check_syncs_per_step(checkpoint: Path, device: str) -> tuple[str, str]:
    if not device.startswith("cuda"):
        return "skipped", "torch's sync debug mode is CUDA's"
    from omnipipe.stage.runner_driver import drive

    runner = _runner(checkpoint, device)
    counts: list[int] = []
    execute = runner.execute

    def counted(batch: list[Any]) -> Any:
        if not all(request.prefilled for request in batch):
            return execute(batch)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return execute(batch)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                counts.append(sum("synchroniz" in str(w.message) for w in seen))

    runner.execute = counted  # drive wraps it in turn, and takes its own wrapper off after
    try:
        drive(runner, _arrivals(PROMPTS))
    finally:
        runner.__dict__.pop("execute", None)
    per_step = sum(counts) / max(1, len(counts))
    return "measured", f"{per_step:.1f} a decode step of up to {len(PROMPTS)} rows ({len(counts)} steps measured)"


def check_recompiles(checkpoint: Path, device: str) -> tuple[str, str]:
    """Graphs compiled after warm-up by the thinker (batches of 1, 4 and 6 rows, other prompts), then by the talker
    (the thinker's answers as its requests, whole and streamed in a token a step)."""
    from torch._dynamo.utils import counters

    from omnipipe.models.qwen3_omni.handoff import thinker2talker, thinker2talker_async_chunk
    from omnipipe.models.qwen3_omni.runners.talker import Qwen3TalkerRunner
    from omnipipe.stage.runner import RunnerContext
    from omnipipe.stage.runner_driver import Arrival, drive

    runner = _runner(checkpoint, device, torch_compile=True)
    runner.warmup()
    before = counters["stats"]["unique_graphs"]
    served = [drive(runner, _arrivals(PROMPTS[:1])), drive(runner, _arrivals(PROMPTS, [0, 1, 3, 4])),
              drive(runner, _arrivals(PROMPTS[1:3] * 3))]
    thinker_graphs = counters["stats"]["unique_graphs"] - before
    runner.close()
    answers = [[o.data for o in result.outputs[rid] if o.data] for result in served[1:] for rid in result.outputs]
    torch._dynamo.reset()  # the talker's graphs counted on their own (the recompile limit is per function)
    talker = Qwen3TalkerRunner(RunnerContext("talker", device, 1, 8, {"model": str(checkpoint),
                                                                      "torch_compile": True}))
    talker.load()
    talker.warmup()
    before = counters["stats"]["unique_graphs"]
    drive(talker, [Arrival("t0", dict(GREEDY), thinker2talker(answers[0]))])
    drive(talker, [Arrival(f"t{i}", dict(GREEDY), thinker2talker(outputs), step=i)
                   for i, outputs in enumerate(answers[:4])])
    streamed = []
    for i, outputs in enumerate(answers[4:]):
        state: dict[str, Any] = {}
        chunks = [chunk for n, output in enumerate(outputs)
                  for chunk in thinker2talker_async_chunk(state, output, n == len(outputs) - 1, None)]
        streamed.append(Arrival(f"s{i}", dict(GREEDY), chunks[:1], step=i,
                                more=[(i + 1 + n, chunk) for n, chunk in enumerate(chunks[1:])]))
    drive(talker, streamed)
    talker_graphs = counters["stats"]["unique_graphs"] - before
    return verdict(thinker_graphs == talker_graphs == 0), (
        f"{thinker_graphs} thinker graphs compiled after warm-up (batches of 1, 4 and 6 rows, other prompts), "
        f"{talker_graphs} talker graphs (batches of 1, 4 and 6, text whole and streamed)")


def released_decoder(layers: int, device: str, dtype: torch.dtype) -> tuple[Any, Any]:
    """Qwen3-Omni's released thinker text decoder with ``layers`` layers and random weights, and its config."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeTextConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextModel

    from omnipipe.models.qwen3_omni.weights.tiny import RELEASED

    config = Qwen3OmniMoeTextConfig(**{**RELEASED["text"], "num_hidden_layers": layers})
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = Qwen3OmniMoeThinkerTextModel(config)
    model = model.to_empty(device=device).to(dtype).eval()
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02, generator=generator)
        rotary = type(model.rotary_emb)(config=config)  # its frequencies, as the model makes them (meta had none)
        for name, buffer in rotary.named_buffers():
            model.rotary_emb.get_buffer(name).copy_(buffer)
    return model, config


def step_times(layers: int, batches: Sequence[int], context: int, steps: int, device: str) -> list[dict[str, Any]]:
    from omnipipe.stage.kv_cache import PagedKVCache, token_bytes

    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    model, config = released_decoder(layers, device, dtype)
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for batch in batches:
        row_tokens = -(-(context + steps + 4) // 16) * 16  # whole blocks
        kv = PagedKVCache.for_model(config, batch * row_tokens * token_bytes(config, dtype), block_tokens=16,
                                    dtype=dtype, device=device)
        keys = [f"r{i}" for i in range(batch)]
        with torch.inference_mode():
            for key in keys:  # each row's history, prefilled alone
                kv.reserve(key, context + steps + 4)
                kv.bind([key], context)
                embeds = torch.randn(1, context, config.hidden_size, dtype=dtype, device=device) * 0.02
                positions = torch.arange(context, device=device).view(1, 1, -1).expand(4, 1, -1)
                model(inputs_embeds=embeds, position_ids=positions, attention_mask=kv.attention_mask(),
                      past_key_values=kv, use_cache=True)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            times = []
            for step in range(steps + 3):
                kv.bind(keys, 1)
                embeds = torch.randn(batch, 1, config.hidden_size, dtype=dtype, device=device) * 0.02
                positions = torch.full((4, batch, 1), context + step, device=device)
                sync()
                start = time.perf_counter()
                model(inputs_embeds=embeds, position_ids=positions, attention_mask=kv.attention_mask(),
                      past_key_values=kv, use_cache=True)
                sync()
                times.append(time.perf_counter() - start)
        mean = sum(times[3:]) / len(times[3:])  # the first steps warm the kernels up
        rows.append({"batch": batch, "context": context, "layers": layers, "step_ms": round(1000 * mean, 2),
                     "tokens_per_s": round(batch / mean, 1),
                     "peak_gib": round(torch.cuda.max_memory_allocated(device) / (1 << 30), 2) if cuda else None})
        del kv
    return rows


def format_report(checks: list[dict[str, Any]], rows: list[dict[str, Any]], device: str) -> str:
    lines = [format_table(["check", "result", "seen"], [[c["check"], c["result"], c["seen"]] for c in checks],
                          title=f"bench gpu-check on {device}: the tiny Qwen3-Omni thinker")]
    lines += ["", format_table(
        ["batch", "context", "layers", "step ms", "tokens/s", "peak GiB", "graphed"],
        [[row["batch"], row["context"], row["layers"], row["step_ms"], row["tokens_per_s"],
          "-" if row["peak_gib"] is None else row["peak_gib"], "not captured yet"] for row in rows],
        title="decode step of Qwen3-Omni's thinker text decoder at the released width (random weights), paged KV")]
    return "\n".join(lines)


def run_checks(device: str, scratch: Path) -> list[dict[str, Any]]:
    from omnipipe.models.qwen3_omni.weights.tiny import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(scratch / "qwen3-omni-tiny", seed=0)
    named: list[tuple[str, Callable[[], tuple[str, str]]]] = [
        ("placement", lambda: check_placement(checkpoint, device)),
        ("batched == alone (float32, TF32 off)", lambda: check_batched_equals_alone(checkpoint, device)),
        ("NaN isolation", lambda: check_nan_isolation(device)),
        ("syncs per decode step", lambda: check_syncs_per_step(checkpoint, device)),
        ("recompiles after warm-up", lambda: check_recompiles(checkpoint, device)),
    ]
    checks = []
    for name, check in named:
        try:
            result, seen = check()
        except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check, and the next one runs
            result, seen = "FAIL", f"{type(exc).__name__}: {exc}"[:200]
        checks.append({"check": name, "result": result, "seen": seen})
        print(f"  {name}: {result} ({seen})", flush=True)
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda[:N] (default: cuda:0 where there is one), or cpu to "
                        "run the same checks on the CPU")
    parser.add_argument("--layers", type=int, default=4, help="layers of the released-width decoder (default 4)")
    parser.add_argument("--batches", default="1,8,32,64", help="rows of the timed decode steps (default 1,8,32,64)")
    parser.add_argument("--context", type=int, default=1024, help="tokens of history each row has (default 1024)")
    parser.add_argument("--steps", type=int, default=20, help="timed decode steps per batch (default 20)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches: comma-separated whole numbers, got {args.batches!r}")
    if any(b < 1 for b in batches) or args.layers < 1 or args.context < 1 or args.steps < 1:
        parser.error("--batches, --layers, --context and --steps must be at least 1")
    device = args.device
    if device is None:
        if not torch.cuda.is_available():
            print(f"bench gpu-check: no CUDA device here (torch {torch.__version__} sees none): nothing to check. "
                  "Run it on a CUDA machine (or with --device cpu to run the same code on the CPU).")
            return 0
        device = "cuda:0"
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {device}: torch {torch.__version__} sees no CUDA device here")
    if device.startswith("cuda"):
        from omnipipe.stage.device import enter_device

        enter_device("thinker", device)  # as a stage process on it does: its current device, its kernel choices
    print(f"bench gpu-check on {device}: checks on the tiny Qwen3-Omni thinker", flush=True)
    with tempfile.TemporaryDirectory(prefix="omnipipe-gpu-check-") as scratch:
        checks = run_checks(device, Path(scratch))
    print("decode steps at the released width...", flush=True)
    rows = step_times(args.layers, batches, args.context, args.steps, device)
    print(format_report(checks, rows, device))
    if args.json:
        write_json(args.json, {"machine": machine_info(), "device": device, "checks": checks, "steps": rows})
    return 0

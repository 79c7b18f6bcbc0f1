"""Engine benchmarks on the toy stages.

    python -m omnipipe.bench.engine [--quick] [--json PATH]

1. latency: one control-plane hop (half a PUSH->PULL round trip between two processes over ipc://, with the real
   msgspec codec and relay_io); each hop of a real request through the three toy stages one after another
   (caller->thinker, thinker->talker, talker->code2wav, code2wav->caller: ``RequestMetrics.hops_s``) beside that
   raw ZMQ hop; and the per-token cost of the whole engine: the mean inter-token latency of a text-only toy
   request, less the toy thinker's own measured compute per step.
2. relay: throughput of ``write_payload`` in one process + ``read_payload`` in another, per backend, next to an
   in-process ``np.copyto`` of the same size (the physical limit): ``bench/relay.py``, which ``omnipipe bench
   relay`` runs alone (and with the mooncake relay beside raw Mooncake transfers).
3. ttfp: time to first audio packet with async chunk on vs off at several concurrencies, with per-call delays
   standing in for model compute, and the ratio that pure compute would give.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import msgspec
import numpy as np
import zmq

from omnipipe.api.async_omni import AsyncOmni
from omnipipe.api.outputs import RequestMetrics
from omnipipe.bench.peer import STOP, connect_peer, ms, run_peer
from omnipipe.bench.relay import bench_relay_throughput, format_relay
from omnipipe.bench.report import format_table, machine_info, mean, summarize, write_json
from omnipipe.transport import control_plane
from omnipipe.transport.messages import StageOutput
from omnipipe.transport.relay.base import Relay
from omnipipe.transport.relay.inline import InlineRelay
from omnipipe.transport.relay_io import read_payload, write_payload

SECTIONS = ("latency", "relay", "ttfp")
HOP_TARGET_P50_MS = 0.3
PIPELINE_HOP_TARGET_P50_MS = 0.15  # each hop of a request through the engine's stages
PIPELINE_HOP_PROMPT = "a"  # one character: the least work each toy stage can do
HOP_ROUNDS = 5
IDLE_GAP_S = 0.003  # between the round trips of the idle raw ZMQ case
SMALL_AUDIO_SAMPLES = 256  # one toy code2wav chunk of 8 frames: 1 KiB of float32
ITL_PROMPT = "the quick brown fox jumps over the lazy dog " * 3
_ack = msgspec.msgpack.Encoder()
_ack_decoder = msgspec.msgpack.Decoder()


@dataclass
class BenchConfig:
    sections: tuple[str, ...] = SECTIONS
    hop_iterations: int = 5000
    pipeline_hop_requests: int = 300
    itl_requests: int = 8
    relay_sizes: tuple[int, ...] = (1 << 20, 64 << 20)
    relay_iterations: tuple[int, ...] = (100, 20)  # per size
    concurrency: tuple[int, ...] = (1, 4, 16)
    num_prompts: int = 16
    thinker_step_ms: float = 20.0
    talker_call_ms: float = 20.0
    code2wav_call_ms: float = 10.0
    max_num_seqs: int | None = None  # per stage; None: the highest concurrency, so no request waits for a slot
    quick: bool = False

    @classmethod
    def quick_config(cls, **overrides: Any) -> BenchConfig:
        base = cls(hop_iterations=300, pipeline_hop_requests=20, itl_requests=2, relay_sizes=(64 << 10, 1 << 20),
                   relay_iterations=(5, 5), concurrency=(1, 2), num_prompts=2, thinker_step_ms=2.0, talker_call_ms=2.0,
                   code2wav_call_ms=1.0, quick=True)
        for key, value in overrides.items():
            setattr(base, key, value)
        return base


# ====================================================================== 1. control-plane hop latency
def _echo_peer(to_peer: str, from_peer: str) -> None:
    """Answer each frame: phase ``raw`` sends the bytes back; phase ``message`` decodes the StageOutput, reads its
    payload and answers with a new StageOutput that writes the payload again. A phase header b"raw:N" or
    b"message:N" precedes its N frames."""
    ctx, pull, push = connect_peer(to_peer, from_peer)
    relays: dict[str, Relay] = {"inline": InlineRelay()}
    inline = InlineRelay()
    try:
        while True:
            header = pull.recv()
            if header == STOP:
                return
            phase, count = header.decode().split(":")
            for _ in range(int(count)):
                frame = pull.recv()
                if phase == "raw":
                    push.send(frame, copy=False)
                    continue
                msg = control_plane.decode(control_plane.FROM_STAGE, frame, "bench echo")
                if not isinstance(msg, StageOutput):
                    raise TypeError("benchmark echo peer got something other than a StageOutput")
                payload = None
                if msg.payload is not None:
                    body = read_payload(msg.payload, relays, msg.request_id)
                    payload = write_payload(body, inline, msg.request_id, 1 << 16)
                reply = StageOutput(msg.request_id, "echo", False, msg.text_delta, msg.num_tokens, payload)
                push.send(control_plane.encode(reply), copy=False)
    finally:
        pull.close(0)
        push.close(0)
        ctx.term()


def _hop_round_trips(push: zmq.Socket, pull: zmq.Socket, phase: str, iterations: int,
                     audio: np.ndarray | None, idle_s: float = 0.0) -> tuple[list[float], int]:
    """Round trips of one phase, ``idle_s`` apart; returns (one-hop times in seconds, bytes of one request frame)."""
    warmup = max(20, iterations // 10)
    inline = InlineRelay()
    relays: dict[str, Relay] = {"inline": inline}
    raw_frame = control_plane.encode(StageOutput("r-bench", "thinker", False, "x", 1,
                                                 write_payload({"audio": audio}, inline, "r-bench", 1 << 16)
                                                 if audio is not None else None))
    push.send(f"{phase}:{warmup + iterations}".encode())
    hops: list[float] = []
    frame_bytes = 0
    for i in range(warmup + iterations):
        if idle_s:
            time.sleep(idle_s)
        start = time.perf_counter()
        if phase == "raw":
            push.send(raw_frame, copy=False)
            pull.recv()
            frame_bytes = len(raw_frame)
        else:
            payload = write_payload({"audio": audio}, inline, "r-bench", 1 << 16) if audio is not None else None
            frame = control_plane.encode(StageOutput("r-bench", "thinker", False, "x", 1, payload))
            push.send(frame, copy=False)
            reply = control_plane.decode(control_plane.FROM_STAGE, pull.recv(), "bench")
            if reply is not None and reply.payload is not None:
                read_payload(reply.payload, relays, reply.request_id)
            frame_bytes = len(frame)
        if i >= warmup:
            hops.append((time.perf_counter() - start) / 2)
    return hops, frame_bytes


def bench_hop_latency(iterations: int) -> list[dict[str, Any]]:
    audio = np.linspace(-1, 1, SMALL_AUDIO_SAMPLES, dtype=np.float32)
    cases = [
        ("zmq only: same bytes, no codec", "raw", audio, 0.0),
        ("StageOutput, text delta", "message", None, 0.0),
        (f"StageOutput + {SMALL_AUDIO_SAMPLES * 4 // 1024} KiB inline payload", "message", audio, 0.0),
        # as in a pipeline at c=1, where each process sleeps between its messages: the wake-ups cost more
        (f"zmq only, both ends idle {IDLE_GAP_S * 1e3:g} ms before each", "raw", audio, IDLE_GAP_S),
    ]
    samples: list[list[float]] = [[] for _ in cases]
    sizes = [0] * len(cases)
    rounds = min(HOP_ROUNDS, iterations)
    with run_peer(_echo_peer) as peer:
        for index in range(rounds):  # the cases take turns, so load drift hits them alike
            share = iterations // rounds + (1 if index < iterations % rounds else 0)
            for case, (_, phase, data, idle_s) in enumerate(cases):
                hops, sizes[case] = _hop_round_trips(peer.push, peer.pull, phase, share, data, idle_s)
                samples[case].extend(hops)
    rows = []
    for (label, phase, _, _), hops, frame_bytes in zip(cases, samples, sizes, strict=True):
        stats = summarize(hops, 1e3)
        rows.append({"message": label, "framework": phase == "message", "frame_bytes": frame_bytes,
                     "iterations": len(hops), "p50_ms": stats["median"], "p99_ms": stats["p99"],
                     "mean_ms": stats["mean"], "samples_ms": [ms(h) for h in hops]})
    return rows


# ====================================================================== 1b. each hop of a request through the stages
async def bench_pipeline_hops(requests: int) -> dict[str, Any]:
    """Sequential one-character requests through the toy thinker -> talker -> code2wav with async chunk off (each
    stage gets its input when the one before has finished), no delays; each request's ``hops_s`` split of E2E."""
    hops: dict[str, list[float]] = {}
    e2e: list[float] = []
    async with AsyncOmni("toy", {"async_chunk": False}) as engine:
        for _ in range(max(5, requests // 10)):  # warm-up
            await _collect_final(engine, PIPELINE_HOP_PROMPT, output_modalities=["audio"])
        for _ in range(requests):
            metrics = await _collect_final(engine, PIPELINE_HOP_PROMPT, output_modalities=["audio"])
            if not metrics.hops_s:
                raise RuntimeError("a sequential toy request came back without its hop timings")
            for name, seconds in metrics.hops_s.items():
                hops.setdefault(name, []).append(seconds)
            e2e.append(metrics.e2e_s)
    rows = []
    for name, samples in hops.items():
        stats = summarize(samples, 1e3)
        rows.append({"hop": name, "p50_ms": stats["median"], "p99_ms": stats["p99"], "mean_ms": stats["mean"],
                     "samples_ms": [ms(h) for h in samples]})
    totals = [sum(h[i] for h in hops.values()) for i in range(requests)]
    e2e_stats, total_stats = summarize(e2e, 1e3), summarize(totals, 1e3)
    return {"requests": requests, "prompt": PIPELINE_HOP_PROMPT, "target_p50_ms": PIPELINE_HOP_TARGET_P50_MS,
            "rows": rows, "hops_total_p50_ms": total_stats["median"], "hops_total_p99_ms": total_stats["p99"],
            "e2e_p50_ms": e2e_stats["median"], "e2e_p99_ms": e2e_stats["p99"], "e2e_samples_ms": [ms(x) for x in e2e]}


# ====================================================================== 1c. per-token engine overhead
async def _collect_final(engine: AsyncOmni, prompt: str, **kwargs: Any) -> RequestMetrics:
    final = None
    async for out in engine.generate(prompt, **kwargs):
        if out.finished:
            final = out
    if final is None or final.metrics is None:
        raise RuntimeError("request ended without a final output")
    return final.metrics


async def bench_token_overhead(requests: int) -> dict[str, Any]:
    """Mean ITL of sequential text-only requests (thinker only), minus the thinker's own compute per step."""
    gaps: list[float] = []
    compute_per_step: list[float] = []
    async with AsyncOmni("toy", {}) as engine:
        await _collect_final(engine, "warm up", output_modalities=["text"])
        for _ in range(requests):
            metrics = await _collect_final(engine, ITL_PROMPT, output_modalities=["text"])
            gaps.extend(metrics.itl_s)
            thinker = metrics.stages["thinker"]
            steps = int(thinker["units"]) + (1 if thinker.get("finish_reason") == "stop" else 0)  # + the EOS step
            compute_per_step.append(float(thinker["compute_s"]) / max(1, steps))
    itl = summarize(gaps, 1e3)
    compute_ms = ms(mean(compute_per_step))
    return {"requests": requests, "tokens_per_request": len(ITL_PROMPT), "gaps": len(gaps),
            "itl_mean_ms": itl["mean"], "itl_median_ms": itl["median"], "itl_p99_ms": itl["p99"],
            "thinker_compute_per_token_ms": compute_ms, "framework_per_token_ms": itl["mean"] - compute_ms,
            "itl_samples_ms": [ms(g) for g in gaps]}


# ====================================================================== 3. TTFP with async chunk on vs off
def ttfp_prompts(count: int) -> list[str]:
    return [f"tell me about stage {i:03d} and what it computes" for i in range(count)]


def expected_ttfp_ms(prompts: Sequence[str], think_ms: float, talk_ms: float, wav_ms: float) -> dict[str, float]:
    """What compute alone gives one request. Off: the thinker runs every token plus its EOS step, then one talker
    and one code2wav call. On: the first word and its space reach the talker, then one talker and one code2wav call.
    """
    off = mean([(len(p.encode()) + 1) * think_ms + talk_ms + wav_ms for p in prompts])
    on = mean([(p.index(" ") + 1) * think_ms + talk_ms + wav_ms for p in prompts])
    return {"on_ms": on, "off_ms": off, "ratio": on / off}


def _ttfp_deploy(config: BenchConfig, async_chunk: bool) -> dict[str, Any]:
    seqs = config.max_num_seqs or max(config.concurrency)
    options = {"thinker": {"step_delay_ms": config.thinker_step_ms},
               "talker": {"call_delay_ms": config.talker_call_ms},
               "code2wav": {"call_delay_ms": config.code2wav_call_ms}}
    return {"async_chunk": async_chunk,
            "stages": {name: {"max_num_seqs": seqs, "options": opts} for name, opts in options.items()}}


async def _run_concurrent(engine: AsyncOmni, prompts: Sequence[str], concurrency: int) -> list[RequestMetrics]:
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> RequestMetrics:
        async with gate:
            return await _collect_final(engine, prompt)

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def _ttfp_row(async_chunk: bool, concurrency: int, metrics: list[RequestMetrics], wall_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {"async_chunk": async_chunk, "concurrency": concurrency, "prompts": len(metrics),
                           "wall_s": wall_s}
    for name in ("e2e", "ttft", "ttfp"):
        values = [getattr(m, f"{name}_s") for m in metrics]
        if any(v is None for v in values):
            raise RuntimeError(f"a request finished without {name}")
        stats = summarize(values, 1e3)
        row |= {f"{name}_mean_ms": stats["mean"], f"{name}_median_ms": stats["median"],
                f"{name}_p99_ms": stats["p99"], f"{name}_samples_ms": [ms(v) for v in values]}
    return row


async def bench_ttfp(config: BenchConfig) -> dict[str, Any]:
    """Both settings live at once and take turns per concurrency, so load drift hits them alike."""
    prompts = ttfp_prompts(config.num_prompts)
    rows: list[dict[str, Any]] = []
    engines = {flag: AsyncOmni("toy", _ttfp_deploy(config, flag)) for flag in (True, False)}
    try:
        for engine in engines.values():
            await engine.start()
            await _run_concurrent(engine, ["warm up the stages"], 1)
        for concurrency in config.concurrency:
            for flag, engine in engines.items():
                start = time.perf_counter()
                metrics = await _run_concurrent(engine, prompts, concurrency)
                rows.append(_ttfp_row(flag, concurrency, metrics, time.perf_counter() - start))
    finally:
        await asyncio.gather(*(engine.shutdown() for engine in engines.values()))
    ratios = []
    for concurrency in config.concurrency:
        on, off = (next(r for r in rows if r["concurrency"] == concurrency and r["async_chunk"] is flag)
                   for flag in (True, False))
        ratios.append({"concurrency": concurrency, "ttfp_on_mean_ms": on["ttfp_mean_ms"],
                       "ttfp_off_mean_ms": off["ttfp_mean_ms"], "ratio": on["ttfp_mean_ms"] / off["ttfp_mean_ms"]})
    delays = {"thinker_step_ms": config.thinker_step_ms, "talker_call_ms": config.talker_call_ms,
              "code2wav_call_ms": config.code2wav_call_ms}
    return {"delays": delays, "max_num_seqs": config.max_num_seqs or max(config.concurrency), "rows": rows,
            "ratios": ratios,
            "expected": expected_ttfp_ms(prompts, config.thinker_step_ms, config.talker_call_ms,
                                         config.code2wav_call_ms)}


# ====================================================================== driver
def run_engine_bench(config: BenchConfig | None = None,
                     on_section: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the chosen sections; ``on_section(name, results)`` is called as each one finishes."""
    config = config or BenchConfig()
    unknown = set(config.sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; expected some of {', '.join(SECTIONS)}")
    results: dict[str, Any] = {"meta": {"config": asdict(config), "machine_at_start": machine_info()}}

    def done(name: str, value: dict[str, Any]) -> None:
        results[name] = value
        if on_section is not None:
            on_section(name, value)

    if "latency" in config.sections:
        hops = bench_hop_latency(config.hop_iterations)
        pipeline_hops = asyncio.run(bench_pipeline_hops(config.pipeline_hop_requests))
        token = asyncio.run(bench_token_overhead(config.itl_requests))
        done("latency", {"target_p50_ms": HOP_TARGET_P50_MS, "hops": hops, "pipeline_hops": pipeline_hops,
                         "token_overhead": token})
    if "relay" in config.sections:
        done("relay", bench_relay_throughput(config.relay_sizes, config.relay_iterations))
    if "ttfp" in config.sections:
        done("ttfp", asyncio.run(bench_ttfp(config)))
    results["meta"]["machine_at_end"] = machine_info()
    return results


def format_section(name: str, data: dict[str, Any]) -> str:
    if name == "latency":
        return _format_latency(data)
    if name == "relay":
        return format_relay(data)
    if name == "ttfp":
        return _format_ttfp(data)
    raise ValueError(f"unknown section {name!r}")


def _format_latency(data: dict[str, Any]) -> str:
    target = data["target_p50_ms"]
    hops = format_table(
        ["message", "frame bytes", "iterations", "p50 ms", "p99 ms", "mean ms", f"p50 < {target} ms"],
        [[h["message"], h["frame_bytes"], h["iterations"], h["p50_ms"], h["p99_ms"], h["mean_ms"],
          ("yes" if h["p50_ms"] < target else "NO") if h["framework"] else "(baseline)"] for h in data["hops"]],
        digits=3, title="Control-plane hop latency (one hop = half a PUSH->PULL round trip, two processes, ipc://)")
    pipeline = _format_pipeline_hops(data["pipeline_hops"], [h for h in data["hops"] if not h["framework"]])
    t = data["token_overhead"]
    token = format_table(
        ["requests", "tokens/request", "mean ITL ms", "median ITL ms", "p99 ITL ms", "thinker compute ms/token",
         "framework ms/token"],
        [[t["requests"], t["tokens_per_request"], t["itl_mean_ms"], t["itl_median_ms"], t["itl_p99_ms"],
          t["thinker_compute_per_token_ms"], t["framework_per_token_ms"]]],
        digits=3, title="Engine per-token overhead (toy pipeline, text only, sequential requests, no delays)")
    return f"{hops}\n\n{pipeline}\n\n{token}"


def _format_pipeline_hops(data: dict[str, Any], raw_hops: list[dict[str, Any]]) -> str:
    target = data["target_p50_ms"]
    rows: list[list[Any]] = [[h["hop"], h["p50_ms"], h["p99_ms"], h["mean_ms"],
                              "yes" if h["p50_ms"] <= target else "NO"] for h in data["rows"]]
    rows.append(["all hops together", data["hops_total_p50_ms"], data["hops_total_p99_ms"], None, None])
    rows.append(["E2E (hops + the stages' own time)", data["e2e_p50_ms"], data["e2e_p99_ms"], None, None])
    rows += [[f"raw ZMQ hop ({raw['message']})", raw["p50_ms"], raw["p99_ms"], raw["mean_ms"], "(baseline)"]
             for raw in raw_hops]
    table = format_table(["hop", "p50 ms", "p99 ms", "mean ms", f"p50 <= {target} ms"], rows, digits=3,
                         title=f"Hops of a request through the toy stages (c=1, async chunk off, {data['requests']} "
                               f"requests of prompt {data['prompt']!r}, audio out)")
    note = ("a hop runs from the sender's perf_counter stamp (the caller handing the request over, a stage's "
            "finished output about to be encoded) to the receiver's (a stage taking its Submit off the socket, the "
            "done event in the caller's hands); stage->stage goes through the orchestrator.")
    return f"{table}\n{note}"


def _format_ttfp(data: dict[str, Any]) -> str:
    d = data["delays"]
    table = format_table(
        ["async_chunk", "concurrency", "prompts", "mean E2E ms", "mean TTFT ms", "mean TTFP ms", "median TTFP ms",
         "p99 TTFP ms", "median E2E ms", "p99 E2E ms", "median TTFT ms", "p99 TTFT ms"],
        [[r["async_chunk"], r["concurrency"], r["prompts"], r["e2e_mean_ms"], r["ttft_mean_ms"], r["ttfp_mean_ms"],
          r["ttfp_median_ms"], r["ttfp_p99_ms"], r["e2e_median_ms"], r["e2e_p99_ms"], r["ttft_median_ms"],
          r["ttft_p99_ms"]] for r in data["rows"]],
        digits=1, title=f"TTFP, async chunk on vs off (toy: thinker step {d['thinker_step_ms']:g} ms, talker call "
                        f"{d['talker_call_ms']:g} ms, code2wav call {d['code2wav_call_ms']:g} ms; "
                        f"max_num_seqs {data['max_num_seqs']})")
    e = data["expected"]
    ratios = format_table(
        ["concurrency", "mean TTFP on ms", "mean TTFP off ms", "on/off", "expected on/off (compute only)"],
        [[r["concurrency"], r["ttfp_on_mean_ms"], r["ttfp_off_mean_ms"], r["ratio"], e["ratio"]]
         for r in data["ratios"]], digits=3)
    note = (f"expected from the stage delays alone, one request: TTFP on {e['on_ms']:.1f} ms, "
            f"off {e['off_ms']:.1f} ms, ratio {e['ratio']:.3f}")
    return f"{table}\n\n{ratios}\n{note}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a fast smoke run: few iterations, small sizes")
    parser.add_argument("--json", metavar="PATH", help="also write the raw figures to PATH")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="what to run")
    parser.add_argument("--num-prompts", type=int, help="prompts per concurrency for ttfp (default 16; quick 2)")
    parser.add_argument("--concurrency", type=int, nargs="+", help="ttfp concurrencies (default 1 4 16; quick 1 2)")
    parser.add_argument("--thinker-step-ms", type=float, help="toy thinker delay per step (default 20; quick 2)")
    parser.add_argument("--talker-call-ms", type=float, help="toy talker delay per call (default 20; quick 2)")
    parser.add_argument("--code2wav-call-ms", type=float, help="toy code2wav delay per call (default 10; quick 1)")
    parser.add_argument("--max-num-seqs", type=int, help="per-stage batch limit (default: the highest concurrency)")
    parser.add_argument("--hop-iterations", type=int, help="round trips per hop case (default 5000; quick 300)")
    parser.add_argument("--pipeline-hop-requests", type=int,
                        help="sequential toy requests timed hop by hop (default 300; quick 20)")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    overrides = {key: value for key, value in {
        "num_prompts": args.num_prompts,
        "concurrency": tuple(args.concurrency) if args.concurrency else None,
        "thinker_step_ms": args.thinker_step_ms,
        "talker_call_ms": args.talker_call_ms,
        "code2wav_call_ms": args.code2wav_call_ms,
        "max_num_seqs": args.max_num_seqs,
        "hop_iterations": args.hop_iterations,
        "pipeline_hop_requests": args.pipeline_hop_requests,
    }.items() if value is not None}
    for key in ("num_prompts", "max_num_seqs", "hop_iterations", "pipeline_hop_requests"):
        if key in overrides and overrides[key] < 1:
            raise ValueError(f"--{key.replace('_', '-')}: must be >= 1")
    if any(c < 1 for c in overrides.get("concurrency", ())):
        raise ValueError("--concurrency: every value must be >= 1")
    overrides["sections"] = tuple(dict.fromkeys(args.sections))
    if args.quick:
        return BenchConfig.quick_config(**overrides)
    return BenchConfig(**overrides)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omnipipe.bench.engine", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    info = machine_info()
    print(f"omnipipe engine benchmark ({'quick' if config.quick else 'full'}): {info['cpu_count']} cpus, "
          f"load average {' '.join(f'{x:.2f}' for x in info['load_avg_1_5_15'])}", flush=True)

    def show(name: str, data: dict[str, Any]) -> None:
        print(f"\n{format_section(name, data)}", flush=True)

    results = run_engine_bench(config, on_section=show)
    end = results["meta"]["machine_at_end"]["load_avg_1_5_15"]
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in end)}")
    if args.json:
        write_json(args.json, results)
        print(f"raw figures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``omnipipe bench SUITE [ARGS]``: the benchmarks, each a module of ``omnipipe.bench`` with its own ``main(argv)``
and ``--help``."""

from __future__ import annotations

import argparse
import importlib

# suite -> the module whose ``main(argv) -> int`` runs it
SUITES = {
    "engine": "omnipipe.bench.engine",
    "relay": "omnipipe.bench.relay",
    "offline": "omnipipe.bench.offline",
    "quality": "omnipipe.bench.quality",
    "serve": "omnipipe.bench.serve",
    "gateway": "omnipipe.bench.gateway",
    "soak": "omnipipe.bench.soak",
    "images": "omnipipe.bench.images",
    "broadcast": "omnipipe.bench.broadcast",
    "thinker": "omnipipe.bench.thinker",
    "placement": "omnipipe.bench.placement",
    "vocoder-seams": "omnipipe.bench.vocoder_seams",
    "voice": "omnipipe.bench.voice",
    "hearing": "omnipipe.bench.hearing",
    "streaming-audio": "omnipipe.bench.streaming_audio",
    "max-num-seqs": "omnipipe.bench.max_num_seqs",
    "speech-families": "omnipipe.bench.speech_families",
    "tools": "omnipipe.bench.tools",
    "prefix-cache": "omnipipe.bench.prefix_cache",
    "sampler": "omnipipe.bench.sampler",
    "gpu-check": "omnipipe.bench.gpu_check",
}

_SUITES_HELP = (
    "engine: framework costs on test stages; relay: relay throughput between two processes per backend (mooncake "
    "beside raw Mooncake reads and shm); offline: the default pipeline vs a sequential baseline (a Qwen-Omni "
    "pipeline: its stages batched vs stepped per request, side by side); quality: the default "
    "pipeline's thinkers side by side on 30 factual questions (right answers, decode tok/s) and a multi-turn recall; "
    "serve: load on a running server; gateway: a worker directly vs through a gateway (recording and not), side by "
    "side; soak: load with stage kills, a stopped stage, clients that leave and malformed requests, and what was left "
    "behind; images: the image pipeline's images/s and latency with step-level, request-level and no batching; "
    "broadcast: a two-rank thinker's requests/s and latency with images moved to its ranks blocking, async or as raw "
    "bytes; thinker: the thinker decoder (each weight format) against llama.cpp and transformers on the same weights: "
    "prefill, decode tok/s at batch 1 and 8; placement: TTFP with every stage on one host vs split over two Ray nodes "
    "(a loopback cluster); vocoder-seams: a streamed vocoder decode (omnipipe's exact windows, transformers' "
    "chunked_decode) against one whole decode: difference over absmax and samples missing; voice: realtime sessions "
    "speaking questions at real-time pace (client commit, server VAD and semantic VAD, several at once; optionally "
    "with a thinking pause mid-question): end of speech -> first audio p50/p99, cut turns, underruns, answers "
    "right, per variant side by side; hearing: the words a realtime session hears (its own pass in a fitted "
    "window) against a whole-clip decode, on 24 spoken questions (4 "
    "with a pause mid-question) per delivery and speed: word error rate each way, the questions misheard; "
    "streaming-audio: a Qwen-Omni thinker's audio features and encoder output made as the clip streams in against "
    "the whole clip at its end: ms left after the last append, and the difference; "
    "max-num-seqs: 8 requests at once through "
    "AsyncOmni with every stage's max_num_seqs 8 vs 1, both Qwen-Omni families; speech-families: the same for "
    "csm, voxtral, voxtral_realtime and moshi (frames/s, tokens/s, audio s/s), and their parameter counts at "
    "--size released; tools: the default thinker's tool "
    "decisions, functions, arguments and JSON validity on 24 prompts, constrained vs free decoding, and the "
    "grammar's cost per decode step; prefix-cache: the default thinker's prefix cache on and off side by side (a "
    "server each): a 3-turn chat with a ~600-token system prompt and a second conversation with the same one, "
    "prompt and cached tokens and TTFT per turn, off / on; sampler: the sampling step on the device beside the "
    "sort-based one it replaced, per batch and setting; gpu-check: on a CUDA machine, placement, batched == "
    "alone, NaN isolation, syncs per step and recompiles of the Qwen3-Omni thinker, and decode step times at the "
    "released width (without CUDA it says so and exits 0)")


def add_bench(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="benchmarks (print a table)")
    b.add_argument("suite", choices=list(SUITES), help=_SUITES_HELP)
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the suite (see --help of the suite)")


def run_bench(args: argparse.Namespace) -> int:
    return importlib.import_module(SUITES[args.suite]).main(args.rest)

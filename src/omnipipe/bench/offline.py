"""``omnipipe bench offline``: the default pipeline through the engine, async chunk on and off side by side, next
to a sequential baseline (the same models called one after another in one process with plain transformers and
piper/onnxruntime code, as a user would write it without omnipipe).

    omnipipe bench offline --pipeline default --num-prompts 20 --concurrency 1,4
    omnipipe bench offline --seed001            # seed 001's conditions: ~100-token answers, 50 prompts, c=1/4/10
    omnipipe bench offline --seed001 --pipeline qwen3_omni --model DIR   # a Qwen3-Omni checkpoint (a tiny one on
                                                # a CPU shows only the framework's share)
    omnipipe bench offline --pipeline qwen3_omni --model DIR --concurrency 1,8,32   # without --seed001: the
                                                # Qwen-Omni batching bench (``bench/omni_batching.py``)

Each row also shows the compute floor of time to first audio (``bench/floor.py``: the first packet's stage pieces
timed one request at a time in this process, before the engine rows) and TTFP over that floor.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import yaml

from omnipipe import AsyncOmni, SamplingParams
from omnipipe.api.outputs import RequestMetrics
from omnipipe.bench import omni_batching
from omnipipe.bench.omni_load import OMNI_PIPELINES
from omnipipe.bench.prompts import LONG_QUESTIONS, QUESTIONS
from omnipipe.bench.report import format_table, machine_info, mean, summarize, write_json

METRICS = ("e2e_s", "ttft_s", "tpot_s", "itl_s", "ttfp_s", "rtf")
# seed 001's table: text in, ~100 tokens of text plus audio out, 50 prompts, concurrency 1, 4 and 10
SEED001 = {"num_prompts": 50, "concurrency": "1,4,10", "max_tokens": 100}


def _row(setting: str, concurrency: int, metrics: list[RequestMetrics], wall_s: float) -> dict[str, Any]:
    values: dict[str, list[float]] = {name: [] for name in METRICS}
    for m in metrics:
        for name in METRICS:
            value = getattr(m, name)
            if name == "itl_s":
                values[name].extend(value)
            elif value is not None:
                values[name].append(value)
    row: dict[str, Any] = {"setting": setting, "concurrency": concurrency, "prompts": len(metrics),
                           "throughput_rps": len(metrics) / wall_s if wall_s else 0.0,
                           "audio_s_mean": mean([m.audio_duration_s for m in metrics]),
                           "output_tokens_mean": mean([float(m.num_output_tokens) for m in metrics])}
    # frames the vocoder decoded (windows with their context) per frame of audio: 1.0 without overlap
    decoded = sum(float(m.stages.get("talker", {}).get("window_frames", 0)) for m in metrics)
    heard = sum(float(m.stages.get("code2wav", {}).get("units", 0)) for m in metrics)
    row["vocoder_frames_per_audio_frame"] = decoded / heard if decoded and heard else None
    # where the CPU went: each stage's compute per request (steps it ran in, batch-shared time counted in full)
    stage_names = sorted({name for m in metrics for name in m.stages})
    row["stage_compute_ms_mean"] = {name: 1000 * mean([float(m.stages.get(name, {}).get("compute_s", 0.0))
                                                       for m in metrics]) for name in stage_names}
    for name, series in values.items():
        scale = 1.0 if name == "rtf" else 1000.0
        row[name.removesuffix("_s")] = summarize(series, scale) if series else None
    return row


async def _engine_rows(pipeline: str, async_chunk: bool, prompts: list[str], concurrencies: list[int],
                       max_tokens: int, deploy: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    params = SamplingParams(max_tokens=max_tokens)
    rows = []
    async with AsyncOmni(pipeline, {**(deploy or {}), "async_chunk": async_chunk}) as engine:
        async for _ in engine.generate("Hello?", sampling_params=params):  # warm-up
            pass
        for concurrency in concurrencies:
            gate = asyncio.Semaphore(concurrency)
            metrics: list[RequestMetrics] = []
            asked: list[str] = []

            async def one(prompt: str, gate: asyncio.Semaphore = gate, metrics: list[RequestMetrics] = metrics,
                          asked: list[str] = asked) -> None:
                async with gate:
                    async for out in engine.generate(prompt, sampling_params=params):
                        if out.finished and out.metrics is not None:
                            metrics.append(out.metrics)
                            asked.append(prompt)

            start = time.perf_counter()
            await asyncio.gather(*(one(p) for p in prompts))
            row = _row(f"async chunk {'on' if async_chunk else 'off'}", concurrency, metrics,
                       time.perf_counter() - start)
            row["prompts_asked"] = asked  # in the order of ``metrics`` (completion order), for the floor ratios
            row["ttfp_s_each"] = [m.ttfp_s for m in metrics]
            rows.append(row)
    return rows


def first_packet_floors(prompts: list[str], max_tokens: int, deploy: dict[str, Any] | None) -> dict[str, Any]:
    """Each distinct prompt's first-packet compute floor (``bench/floor.py``), with the deploy's edge options."""
    from omnipipe.bench.floor import FloorProbe
    from omnipipe.config.deploy_config import load_deploy
    from omnipipe.models.registry import get_pipeline

    config = load_deploy(deploy or None, get_pipeline("default"))
    probe = FloorProbe(config.stages["thinker"].options, config.edges["talker->code2wav"].options,
                       config.edges["thinker->talker"].options, threads=config.stage("thinker").threads)
    try:
        floors = {prompt: probe.measure(prompt, max_tokens) for prompt in dict.fromkeys(prompts)}
    finally:
        probe.close()
    pieces = ("prefill_s", "decode_s", "talker_s", "vocoder_s")
    return {"per_prompt": {p: {"total_s": f.total_s, "decode_tokens": f.decode_tokens, "first_piece": f.first_piece,
                               **{k: getattr(f, k) for k in pieces}} for p, f in floors.items()},
            "mean_ms": {k.removesuffix("_s"): 1000 * mean([getattr(f, k) for f in floors.values()])
                        for k in (*pieces, "total_s")},
            "decode_tokens_mean": mean([float(f.decode_tokens) for f in floors.values()])}


def add_floor(rows: list[dict[str, Any]], floors: dict[str, Any]) -> None:
    """Per row: the mean floor of the requests it ran, and TTFP over floor (median of the per-request ratios)."""
    per_prompt = floors["per_prompt"]
    for row in rows:
        asked, ttfps = row.get("prompts_asked", []), row.get("ttfp_s_each", [])
        pairs = [(ttfp, per_prompt[p]["total_s"]) for p, ttfp in zip(asked, ttfps, strict=False)
                 if ttfp is not None and p in per_prompt and per_prompt[p]["total_s"] > 0]
        if pairs:
            row["floor_ms_mean"] = 1000 * mean([f for _, f in pairs])
            row["ttfp_over_floor"] = summarize([t / f for t, f in pairs])


def sequential_baseline(prompts: list[str], max_tokens: int) -> dict[str, Any]:
    """One process, no framework: transformers greedy generate, then Piper speaks the whole answer."""
    import torch
    from piper import PiperVoice
    from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, StoppingCriteriaList
    from transformers.generation.streamers import BaseStreamer

    from omnipipe.models.default.pipeline import THINKER
    from omnipipe.models.default.runners.thinker import thinker_model
    from omnipipe.models.default.weights.thinker import prepare_thinker
    from omnipipe.models.default.weights.voice import PACKAGED_VOICES

    torch.set_num_threads(2)
    model_name = THINKER.default_options["model"]  # the thinker the engine rows ran
    prompt_format = thinker_model(model_name).prompt_format()
    stops = prompt_format.stop_strings()
    model_dir = prepare_thinker(model_name, progress=True)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    model.eval()
    voice_files = PACKAGED_VOICES["joe"]
    voice = PiperVoice.load(voice_files.model_path(), voice_files.config_path())

    class TokenClock(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.prompt_seen = False

        def put(self, value: Any) -> None:
            if not self.prompt_seen:
                self.prompt_seen = True
                return
            self.times.append(time.perf_counter())

        def end(self) -> None:
            return None

    class StopAtStrings(StoppingCriteria):
        """Stop once the answer contains a stop string (decodes only the generated tail: cheap per step)."""

        def __init__(self, prompt_length: int) -> None:
            self.prompt_length = prompt_length

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            text = tokenizer.decode(input_ids[0, self.prompt_length:], skip_special_tokens=True)
            done = any(stop in text for stop in stops)
            return torch.full((input_ids.shape[0],), done, dtype=torch.bool)

    metrics = []
    start_all = time.perf_counter()
    for question in prompts:
        start = time.perf_counter()
        prompt = prompt_format.preamble() + prompt_format.turns(question)
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=True)
        clock = TokenClock()
        with torch.inference_mode():
            out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False, streamer=clock,
                                 stopping_criteria=StoppingCriteriaList([StopAtStrings(ids["input_ids"].shape[1])]))
        text = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        for stop in stops:
            text = text.split(stop)[0]
        audio = np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text.strip() or ".")])
        end = time.perf_counter()
        duration = len(audio) / voice.config.sample_rate
        times = [t - start for t in clock.times]
        metrics.append(RequestMetrics(
            e2e_s=end - start, ttft_s=times[0] if times else None,
            tpot_s=(times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None,
            itl_s=[b - a for a, b in zip(times, times[1:], strict=False)], ttfp_s=end - start,
            audio_duration_s=duration,
            rtf=(end - start) / duration if duration else None, num_output_tokens=len(times)))
    return _row("sequential baseline", 1, metrics, time.perf_counter() - start_all)


def format_report(rows: list[dict[str, Any]]) -> str:
    def m(row: dict[str, Any], name: str, stat: str = "mean") -> float | None:
        return row[name][stat] if row.get(name) else None

    headers = ["Setting", "Max_Concurrency", "Prompts", "Mean E2E (ms)", "Mean TTFT (ms)", "Mean TPOT (ms)",
               "Mean TTFP (ms)", "Mean RTF", "Mean ITL (ms)", "req/s"]
    main = format_table(headers, [[r["setting"], r["concurrency"], r["prompts"], m(r, "e2e"), m(r, "ttft"),
                                   m(r, "tpot"), m(r, "ttfp"), m(r, "rtf"), m(r, "itl"), r["throughput_rps"]]
                                  for r in rows])
    detail_headers = ["Setting", "Conc."] + [f"{n} {s}" for n in ("E2E", "TTFT", "TTFP", "RTF")
                                               for s in ("median", "p99")]
    detail = format_table(detail_headers, [[r["setting"], r["concurrency"],
                                            *[m(r, n, s) for n in ("e2e", "ttft", "ttfp", "rtf")
                                              for s in ("median", "p99")]] for r in rows])
    lines = [main, "", detail]
    if any("floor_ms_mean" in r for r in rows):
        floor_rows = [[r["setting"], r["concurrency"], r.get("output_tokens_mean"),
                       r.get("vocoder_frames_per_audio_frame"), m(r, "ttfp", "median"),
                       m(r, "ttfp"), r.get("floor_ms_mean"),
                       r["ttfp_over_floor"]["median"] if r.get("ttfp_over_floor") else None]
                      for r in rows if "prompts_asked" in r]
        lines += ["", "TTFP against the compute floor (prefill + thinker tokens to the first spoken piece + talker on "
                  "it + the first vocoder window, each timed alone; aim: TTFP <= 1.3x floor)",
                  format_table(["Setting", "Conc.", "Out tokens", "Vocoder frames/audio frame", "TTFP p50 (ms)",
                                "TTFP mean (ms)",
                                "Floor mean (ms)", "TTFP/floor p50"], floor_rows)]
    stages = sorted({name for r in rows for name in r.get("stage_compute_ms_mean") or {}})
    if stages:
        lines += ["", "Stage compute per request, mean (ms; a batched step counts in full for each of its requests)",
                  format_table(["Setting", "Conc.", *stages],
                               [[r["setting"], r["concurrency"],
                                 *[(r.get("stage_compute_ms_mean") or {}).get(n) for n in stages]]
                                for r in rows if r.get("stage_compute_ms_mean")])]
    baseline = next((r for r in rows if r["setting"] == "sequential baseline"), None)
    on1 = next((r for r in rows if r["setting"] == "async chunk on" and r["concurrency"] == 1), None)
    off1 = next((r for r in rows if r["setting"] == "async chunk off" and r["concurrency"] == 1), None)
    if on1 and baseline:
        lines.append(f"\nTTFP async chunk on / sequential baseline at concurrency 1: "
                     f"{m(on1, 'ttfp') / m(baseline, 'ttfp'):.3f} (aim <= 0.10)")
    if baseline:
        for r in rows:
            if r["setting"] == "async chunk on" and r["concurrency"] > 1:
                lines.append(f"TTFP async chunk on at concurrency {r['concurrency']} / sequential baseline (one "
                             f"at a time): {m(r, 'ttfp') / m(baseline, 'ttfp'):.3f}"
                             + (" (aim <= 0.2)" if r["concurrency"] == 10 else ""))
    if on1 and off1:
        lines.append(f"TTFP async chunk on / off at concurrency 1: {m(on1, 'ttfp') / m(off1, 'ttfp'):.3f}")
    for on in (r for r in rows if r["setting"] == "async chunk on"):
        off = next((r for r in rows if r["setting"] == "async chunk off" and r["concurrency"] == on["concurrency"]),
                   None)
        if off and off["throughput_rps"]:
            lines.append(f"req/s async chunk on / off at concurrency {on['concurrency']}: "
                         f"{on['throughput_rps'] / off['throughput_rps']:.3f} (aim >= 1)")
    if on1:
        lines.append(f"RTF at concurrency 1 with async chunk: {m(on1, 'rtf'):.3f} (aim < 1)")
    return "\n".join(lines)


def _deploy(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any] | None:
    """The engine rows' deploy: ``--deploy``'s YAML, with ``--model`` as every model stage's checkpoint
    (``parser.error`` exits on a bad one)."""
    deploy: dict[str, Any] | None = None
    if args.deploy:
        with open(args.deploy) as handle:
            deploy = yaml.safe_load(handle) or {}
        if not isinstance(deploy, dict):
            parser.error(f"--deploy: {args.deploy} must hold a mapping")
    if args.model is not None:
        from omnipipe.models.registry import get_pipeline

        stages = get_pipeline(args.pipeline).model_stages
        if not stages:
            parser.error(f"--model: pipeline {args.pipeline!r} has no stage whose model can be chosen")
        deploy = deploy or {}
        for stage in stages:
            deploy.setdefault("stages", {}).setdefault(stage, {}).setdefault("options", {})["model"] = args.model
    return deploy


def main(argv: Sequence[str] | None = None) -> int:
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--pipeline")
    peek.add_argument("--seed001", action="store_true")
    known, _ = peek.parse_known_args(argv)
    if known.pipeline in OMNI_PIPELINES and not known.seed001:
        return omni_batching.main(argv)
    parser = argparse.ArgumentParser(
        prog="omnipipe bench offline", description=__doc__.split("\n\n")[0],
        epilog="With --pipeline qwen3_omni or qwen2_5_omni (and no --seed001) it measures the stages batched against "
               "stepped per request instead: omnipipe bench offline --pipeline qwen3_omni --model DIR --help")
    parser.add_argument("--pipeline", default="default")
    parser.add_argument("--seed001", action="store_true",
                        help="seed 001's conditions: questions asking for long answers, --max-tokens 100, "
                             "--num-prompts 50, --concurrency 1,4,10 (each may still be set), and the TTFP floor")
    parser.add_argument("--num-prompts", type=int, default=None, help="default 20 (50 with --seed001)")
    parser.add_argument("--concurrency", default=None, help="comma-separated, e.g. 1,4 (default; 1,4,10 with "
                        "--seed001)")
    parser.add_argument("--max-tokens", type=int, default=None, help="default 40 (100 with --seed001)")
    parser.add_argument("--floor", action="store_true", help="measure the TTFP compute floor (on with --seed001)")
    parser.add_argument("--settings", default="on,off", help="which async chunk settings to run: on, off or on,off")
    parser.add_argument("--deploy", help="a deploy YAML for the engine rows (async_chunk is set by the bench)")
    parser.add_argument("--model", help="the checkpoint directory of a pipeline whose stages load one (qwen3_omni, "
                        "qwen2_5_omni; `omnipipe tiny-checkpoint` writes a tiny one)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the sequential baseline")
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args(argv)
    preset = SEED001 if args.seed001 else {"num_prompts": 20, "concurrency": "1,4", "max_tokens": 40}
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not settings or any(s not in ("on", "off") for s in settings):
        parser.error("--settings: on, off or on,off")
    deploy = _deploy(parser, args)
    try:
        concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error("--concurrency: comma-separated integers, e.g. 1,4")
    if args.num_prompts < 1 or not concurrencies or min(concurrencies) < 1:
        parser.error("--num-prompts and --concurrency must be >= 1")
    questions = LONG_QUESTIONS if args.seed001 else QUESTIONS
    prompts = [questions[i % len(questions)] for i in range(args.num_prompts)]
    rows: list[dict[str, Any]] = []
    floors = None
    if (args.floor or args.seed001) and args.pipeline == "default":  # alone first: nothing else on the cores
        floors = first_packet_floors(prompts, args.max_tokens, deploy)
    for setting in settings:
        rows += asyncio.run(_engine_rows(args.pipeline, setting == "on", prompts, concurrencies, args.max_tokens,
                                         deploy))
    if floors is not None:
        add_floor(rows, floors)
    if not args.no_baseline and args.pipeline == "default":
        rows.append(sequential_baseline(prompts, args.max_tokens))
    print(format_report(rows))
    if floors is not None:
        mean_ms = floors["mean_ms"]
        print(f"\nfloor pieces, mean (ms): prefill {mean_ms['prefill']:.0f}, thinker decode to the first piece "
              f"{mean_ms['decode']:.0f} ({floors['decode_tokens_mean']:.1f} tokens), talker {mean_ms['talker']:.0f}, "
              f"first vocoder window {mean_ms['vocoder']:.0f}; total {mean_ms['total']:.0f}")
    if args.json:
        write_json(args.json, {"machine": machine_info(), "rows": rows, "floor": floors})
    return 0


if __name__ == "__main__":
    sys.exit(main())

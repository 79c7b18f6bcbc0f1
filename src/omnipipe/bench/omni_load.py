"""What the Qwen-Omni benchmarks share: the deploy that points every stage at one checkpoint (device, dtype, batch
size, stepping per request or batched), and a load of requests sent through ``AsyncOmni`` with each request's
stream recorded as it reaches the caller (text tokens, audio packets with their arrival times, talker frames).

A stream is *kept in real time* when playback started at its first audio packet never runs dry: every later packet
arrives before the audio delivered ahead of it has finished playing."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from omnipipe import AsyncOmni, SamplingParams
from omnipipe.bench.prompts import QUESTIONS
from omnipipe.bench.report import percentile

OMNI_PIPELINES = ("qwen3_omni", "qwen2_5_omni")


def omni_deploy(pipeline: str, model: str, *, max_num_seqs: int, step_per_request: bool = False,
                device: str | None = None, dtype: str | None = None) -> dict[str, Any]:
    """Every model stage of ``pipeline`` on the checkpoint ``model``, ``max_num_seqs`` requests a stage at most;
    ``step_per_request``: each request of a batch in its own runner call (the unbatched comparison)."""
    from omnipipe.models.registry import get_pipeline

    stages: dict[str, Any] = {}
    for stage in get_pipeline(pipeline).model_stages:
        options: dict[str, Any] = {"model": model}
        if step_per_request:
            options["step_per_request"] = True
        if dtype:
            options["dtype"] = dtype
        stages[stage] = {"max_num_seqs": max_num_seqs, "options": options, **({"device": device} if device else {})}
    return {"stages": stages}


@dataclass
class StreamRecord:
    """One request as the caller saw it."""

    start_s: float
    text_tokens: int = 0
    talker_frames: int = 0
    ttfp_s: float | None = None
    packets: list[tuple[float, float]] = field(default_factory=list)  # (arrival s after start, seconds of audio)

    @property
    def audio_s(self) -> float:
        return sum(seconds for _, seconds in self.packets)

    def kept_in_real_time(self) -> bool | None:
        """Playback from the first packet never underruns (None: no audio)."""
        if not self.packets:
            return None
        first, played = self.packets[0][0], 0.0
        for arrival, seconds in self.packets:
            if arrival - first > played:
                return False
            played += seconds
        return True


@dataclass
class LoadResult:
    """A load's streams and its wall time (first request sent to the last one finished)."""

    streams: list[StreamRecord]
    wall_s: float

    def thinker_tokens_per_s(self) -> float:
        return sum(s.text_tokens for s in self.streams) / self.wall_s

    def talker_frames_per_s(self) -> float:
        return sum(s.talker_frames for s in self.streams) / self.wall_s

    def audio_s_per_s(self) -> float:
        return sum(s.audio_s for s in self.streams) / self.wall_s

    def real_time_streams(self) -> tuple[int, int]:
        """(streams kept in real time, streams with audio)."""
        verdicts = [s.kept_in_real_time() for s in self.streams]
        return sum(1 for v in verdicts if v), sum(1 for v in verdicts if v is not None)

    def ttfp_ms(self, pct: float) -> float | None:
        values = [s.ttfp_s * 1000 for s in self.streams if s.ttfp_s is not None]
        return percentile(values, pct) if values else None


def stage_params(max_tokens: int, talker_frames: int | None) -> dict[str, SamplingParams]:
    """The thinker's answer length, and the talker's cap in codec frames (a checkpoint whose end tokens are
    suppressed would otherwise speak to the talker's own cap)."""
    params = {"thinker": SamplingParams(max_tokens=max_tokens)}
    if talker_frames is not None:
        params["talker"] = SamplingParams(max_tokens=talker_frames)
    return params


async def _one(engine: AsyncOmni, prompt: str, params: dict[str, SamplingParams], modalities: list[str],
               gate: asyncio.Semaphore) -> StreamRecord:
    async with gate:
        record = StreamRecord(start_s=time.perf_counter())
        async for out in engine.generate(prompt, sampling_params=params, output_modalities=modalities):
            if out.modality == "text":
                record.text_tokens += out.num_tokens
            elif out.modality == "audio" and out.audio is not None and not out.finished:
                record.packets.append((time.perf_counter() - record.start_s, out.audio_duration_s))
            if out.finished and out.metrics is not None:
                record.ttfp_s = out.metrics.ttfp_s
                record.text_tokens = out.metrics.num_output_tokens or record.text_tokens
                record.talker_frames = int(out.metrics.stages.get("talker", {}).get("units", 0))
        return record


async def run_load(engine: AsyncOmni, requests: int, concurrency: int, params: dict[str, SamplingParams],
                   modalities: list[str]) -> LoadResult:
    """``requests`` questions, at most ``concurrency`` in flight, through a started engine."""
    gate = asyncio.Semaphore(concurrency)
    prompts = [QUESTIONS[i % len(QUESTIONS)] for i in range(requests)]
    start = time.perf_counter()
    streams = await asyncio.gather(*(_one(engine, p, params, modalities, gate) for p in prompts))
    return LoadResult(list(streams), time.perf_counter() - start)


async def warm_up(engine: AsyncOmni, params: dict[str, SamplingParams], modalities: list[str]) -> None:
    """One request through every stage first, so the loads time no start-up."""
    await run_load(engine, 1, 1, params, modalities)

"""``omnipipe bench vocoder-seams``: how far a streamed vocoder decode is from one whole decode of the same codes.

A tiny, seeded, random Qwen3-Omni code2wav (the real structure: upsampling (2, 2), decoder strides (8, 5, 4, 3),
a sliding-window transformer; smaller widths and fewer layers) decodes random codes whole, then in windows of
``chunk`` new frames with ``left`` context frames: omnipipe's ``decode_windows`` at the exact left context and at
fewer, and transformers' ``chunked_decode``. Each row: the largest difference from the whole decode over its
absmax, at the samples' true stream positions and as the pieces are played back to back, and the samples the
stream lacks.

    omnipipe bench vocoder-seams                     # 300 frames, float64
    omnipipe bench vocoder-seams --dtype float32 --frames 200 --json seams.json

Other vocoders add rows through ``ROW_SOURCES``: a function ``(SeamSettings) -> list[SeamRow]`` that decodes its
own tiny model whole and streamed and scores each stream with ``seam_row``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from omnipipe.bench.report import format_table, machine_info, write_json

TINY_CODEBOOK_SIZE = 64


@dataclass(frozen=True)
class SeamSettings:
    """What every row source decodes: ``frames`` random codes from ``seed``, in ``dtype``."""

    frames: int = 300
    seed: int = 0
    dtype: torch.dtype = torch.float64
    layers: int = 2  # transformer layers of the tiny model (the published one has 8)
    sliding_window: int = 72  # as published
    num_quantizers: int = 16  # as published (the talker's num_code_groups)


@dataclass(frozen=True)
class SeamRow:
    method: str
    chunk_frames: int | None
    left_context_frames: int | None
    frames_decoded: int  # code frames through the vocoder, context frames counted each time
    error_at_positions: float  # max |streamed - whole| / absmax(whole), each piece at its true stream position
    error_as_played: float  # the same with the pieces back to back (a gap shifts everything after it)
    samples_missing: int  # len(whole) - len(stream)
    wall_s: float


def seam_row(method: str, chunk_frames: int | None, left_context_frames: int | None, whole: torch.Tensor,
             pieces: Sequence[tuple[int, torch.Tensor]], frames_decoded: int, wall_s: float) -> SeamRow:
    """Score a streamed decode against ``whole`` (1-D): ``pieces`` are (stream position of the piece's first
    sample, its 1-D samples) in playback order."""
    absmax = whole.abs().max().item()
    if absmax == 0:
        raise ValueError("the whole decode is silent: no scale to measure a difference against")
    at_positions = 0.0
    for position, samples in pieces:
        if position < 0 or position + samples.numel() > whole.numel():
            raise ValueError(f"a piece of {samples.numel()} samples at {position} lies outside the whole decode's "
                             f"{whole.numel()} samples")
        if samples.numel():
            at_positions = max(at_positions, (samples - whole[position: position + samples.numel()]).abs().max().item())
    played = torch.cat([samples.reshape(-1) for _, samples in pieces]) if pieces else whole.new_zeros(0)
    common = min(played.numel(), whole.numel())
    as_played = (played[:common] - whole[:common]).abs().max().item() if common else 0.0
    return SeamRow(method, chunk_frames, left_context_frames, frames_decoded, at_positions / absmax,
                   as_played / absmax, whole.numel() - played.numel(), wall_s)


def tiny_code2wav(settings: SeamSettings, **config_overrides: object) -> torch.nn.Module:
    """A seeded random ``Qwen3OmniMoeCode2Wav`` of the published structure with small widths (``config_overrides``
    change any config field). Weights are drawn with unit gain per layer (the library's own init makes a
    near-silent output) and damped on the residual and upsampling paths so activations stay near 1 through the
    decoder."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    from omnipipe.models.qwen3_omni.weights.tiny import audible_code2wav

    fields = dict(codebook_size=TINY_CODEBOOK_SIZE, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                  intermediate_size=64, num_hidden_layers=settings.layers, sliding_window=settings.sliding_window,
                  num_quantizers=settings.num_quantizers, decoder_dim=32, layer_scale_initial_scale=0.1)
    config = Qwen3OmniMoeCode2WavConfig(**{**fields, **config_overrides})
    torch.manual_seed(settings.seed)
    model = Qwen3OmniMoeCode2Wav(config).eval()
    audible_code2wav(model)
    return model.to(settings.dtype)


def random_codes(settings: SeamSettings, frames: int | None = None) -> torch.Tensor:
    """[1, num_quantizers, frames] codes drawn from ``settings.seed``."""
    generator = torch.Generator().manual_seed(settings.seed + 1)
    return torch.randint(0, TINY_CODEBOOK_SIZE, (1, settings.num_quantizers, frames or settings.frames),
                         generator=generator)


def stream_with_decode_windows(model: torch.nn.Module, codes: torch.Tensor, chunk_frames: int,
                               left_context_frames: int) -> tuple[list[tuple[int, torch.Tensor]], int]:
    """omnipipe's windows over ``codes`` [1, Q, T]: the pieces (stream position, samples) and frames decoded."""
    from omnipipe.models.qwen3_omni.modeling.code2wav_stream import CodeWindow, code2wav_geometry, decode_windows

    geometry = code2wav_geometry(model)
    pieces, decoded, start = [], 0, 0
    while start < codes.shape[-1]:
        end = min(start + chunk_frames, codes.shape[-1])
        context = min(left_context_frames, start)
        window = CodeWindow(codes[0, :, start - context: end], context, start)
        pieces.append((geometry.stream_position(start), decode_windows(model, [window])[0]))
        decoded += end - start + context
        start = end
    return pieces, decoded


def stream_with_chunked_decode(model: torch.nn.Module, codes: torch.Tensor, chunk_frames: int,
                               left_context_frames: int) -> tuple[list[tuple[int, torch.Tensor]], int]:
    """transformers' ``chunked_decode`` over ``codes``, cut back into its chunks: chunk [s, e) returns the whole
    decode's samples from ``s * samples_per_frame`` on, ``tail_samples`` short of ``e * samples_per_frame``."""
    from omnipipe.models.qwen3_omni.modeling.code2wav_stream import code2wav_geometry

    geometry = code2wav_geometry(model)
    with torch.inference_mode():
        wave = model.chunked_decode(codes, chunk_size=chunk_frames, left_context_size=left_context_frames)[0, 0]
    pieces, decoded, offset = [], 0, 0
    for start in range(0, codes.shape[-1], chunk_frames):
        end = min(start + chunk_frames, codes.shape[-1])
        length = (end - start) * geometry.samples_per_frame - geometry.tail_samples
        pieces.append((start * geometry.samples_per_frame, wave[offset: offset + length]))
        offset += length
        decoded += end - start + (left_context_frames if start - left_context_frames > 0 else start)
    if offset != wave.numel():
        raise RuntimeError(f"chunked_decode returned {wave.numel()} samples, its chunks account for {offset}")
    return pieces, decoded


def qwen3_code2wav_rows(settings: SeamSettings) -> list[SeamRow]:
    """The Qwen3-Omni code2wav rows: a rounding floor, omnipipe's windows, transformers' chunked_decode."""
    from omnipipe.models.qwen3_omni.modeling.code2wav_stream import exact_left_context_frames

    model = tiny_code2wav(settings)
    codes = random_codes(settings)
    exact = exact_left_context_frames(model)
    with torch.inference_mode():
        start = time.perf_counter()
        whole = model(codes)[0, 0]
        whole_s = time.perf_counter() - start
        # the same codes in a longer call: what rounding alone moves (the decode is causal, extra frames change
        # no earlier sample in exact arithmetic)
        longer = model(torch.cat([codes, random_codes(settings, 25)], dim=-1))[0, 0, : whole.numel()]
    rows = [seam_row("whole decode in a longer call (rounding floor)", None, None, whole, [(0, longer)],
                     codes.shape[-1] + 25, whole_s)]
    runs: list[tuple[str, Callable, int, int]] = [
        ("omnipipe decode_windows", stream_with_decode_windows, 25, exact),
        ("omnipipe decode_windows", stream_with_decode_windows, 25, exact - 1),
        ("omnipipe decode_windows", stream_with_decode_windows, 25, 50),
        ("omnipipe decode_windows", stream_with_decode_windows, 25, 25),
        ("transformers chunked_decode", stream_with_chunked_decode, 25, 25),
        ("transformers chunked_decode", stream_with_chunked_decode, 50, 25),
    ]
    for method, stream, chunk_frames, left in runs:
        start = time.perf_counter()
        pieces, decoded = stream(model, codes, chunk_frames, left)
        rows.append(seam_row(method, chunk_frames, left, whole, pieces, decoded, time.perf_counter() - start))
    return rows


# Row sources, each ``(SeamSettings) -> list[SeamRow]``: another vocoder's rows are one more entry here.
ROW_SOURCES: list[Callable[[SeamSettings], list[SeamRow]]] = [qwen3_code2wav_rows]


def published_exact_left_context() -> tuple[int, int]:
    """The exact left context and samples per frame of the published code2wav config (built on the meta device:
    no weights, no memory)."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    from omnipipe.models.qwen3_omni.modeling.code2wav_stream import code2wav_geometry

    with torch.device("meta"):
        geometry = code2wav_geometry(Qwen3OmniMoeCode2Wav(Qwen3OmniMoeCode2WavConfig()))
    return geometry.exact_left_context_frames, geometry.samples_per_frame


def format_report(rows: Sequence[SeamRow], settings: SeamSettings) -> str:
    table = format_table(
        ["Method", "Chunk frames", "Left context", "Frames decoded", "max|diff|/absmax at positions",
         "max|diff|/absmax as played", "Samples missing", "Wall s"],
        [[r.method, r.chunk_frames, r.left_context_frames, r.frames_decoded, f"{r.error_at_positions:.2e}",
          f"{r.error_as_played:.2e}", r.samples_missing, r.wall_s] for r in rows],
        title=f"Streamed vs whole vocoder decode: {settings.frames} random frames, seed {settings.seed}, "
              f"{str(settings.dtype).removeprefix('torch.')}, tiny Qwen3 code2wav ({settings.layers} layers, "
              f"sliding window {settings.sliding_window}, {settings.num_quantizers} quantizers)")
    exact, samples_per_frame = published_exact_left_context()
    return (f"{table}\nThe published Qwen3-Omni code2wav config (8 layers, sliding window 72) needs {exact} frames "
            f"of left context for an exact window ({samples_per_frame} samples per frame).")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench vocoder-seams", description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=300, help="random code frames to decode (default 300)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                        help="float64 (default) shows the seams apart from rounding; float32 is how a model serves")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers of the tiny model (default 2)")
    parser.add_argument("--sliding-window", type=int, default=72)
    parser.add_argument("--num-quantizers", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    for name in ("frames", "layers", "sliding_window", "num_quantizers", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    torch.set_num_threads(args.threads)
    settings = SeamSettings(args.frames, args.seed, getattr(torch, args.dtype), args.layers, args.sliding_window,
                            args.num_quantizers)
    print(f"omnipipe bench vocoder-seams: {settings.frames} frames, {args.dtype}", file=sys.stderr)
    rows = [row for source in ROW_SOURCES for row in source(settings)]
    print(format_report(rows, settings))
    if args.json:
        write_json(args.json, {"meta": {"machine": machine_info(), "settings": {**asdict(settings),
                                                                                   "dtype": args.dtype}},
                               "rows": [asdict(row) for row in rows]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

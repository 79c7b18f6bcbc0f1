"""``omnipipe bench vocoder-seams``: how far a streamed vocoder decode is from one whole decode of the same codes.

Qwen3-Omni (``--family qwen3_omni``): a tiny, seeded, random code2wav (the real structure: upsampling (2, 2),
decoder strides (8, 5, 4, 3), a sliding-window transformer; smaller widths and fewer layers) decodes random codes
whole, then in windows of ``chunk`` new frames with ``left`` context frames: omnipipe's ``decode_windows`` at the
exact left context and at fewer, and transformers' ``chunked_decode``.

Qwen2.5-Omni (``--family qwen2_5_omni``): the tiny checkpoint's token2wav (DiT + BigVGAN, seeded, random) decodes
random codes whole, then as the token2wav stage streams them (``Token2WavStream``: fixed noise, windows on the DiT's
blocks with left and right context codes, the vocoder's left mel); transformers decodes token2wav whole only.

Each row: the largest difference from the whole decode over its absmax, at the samples' true stream positions and
as the pieces are played back to back, and the samples the stream lacks.

    omnipipe bench vocoder-seams                     # both families (--family all), float64
    omnipipe bench vocoder-seams --family qwen3_omni --dtype float32 --frames 200 --json seams.json

Other vocoders add a table through ``ROW_SOURCES``: family -> a function ``(SeamSettings) -> SeamTable`` that
decodes its own tiny model whole and streamed and scores each stream with ``seam_row``.
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
    token2wav_codes: int = 96  # Qwen2.5-Omni codes (its DiT is slower per code than the code2wav per frame)


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
    right_context_frames: int | None = None  # look-ahead frames (a vocoder that reads ahead)


@dataclass(frozen=True)
class SeamTable:
    """One vocoder's rows under a title saying what was decoded, and a note printed below them."""

    title: str
    rows: list[SeamRow]
    note: str = ""


def seam_row(method: str, chunk_frames: int | None, left_context_frames: int | None, whole: torch.Tensor,
             pieces: Sequence[tuple[int, torch.Tensor]], frames_decoded: int, wall_s: float,
             right_context_frames: int | None = None) -> SeamRow:
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
                   as_played / absmax, whole.numel() - played.numel(), wall_s, right_context_frames)


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


def qwen3_code2wav_table(settings: SeamSettings) -> SeamTable:
    title = (f"Qwen3-Omni code2wav, streamed vs whole: {settings.frames} random frames, seed {settings.seed}, "
             f"{str(settings.dtype).removeprefix('torch.')}, tiny code2wav ({settings.layers} layers, sliding window "
             f"{settings.sliding_window}, {settings.num_quantizers} quantizers)")
    exact, samples_per_frame = published_exact_left_context()
    note = (f"The published Qwen3-Omni code2wav config (8 layers, sliding window 72) needs {exact} frames of left "
            f"context for an exact window ({samples_per_frame} samples per frame).")
    return SeamTable(title, qwen3_code2wav_rows(settings), note)


# (chunk codes, left context codes, right context codes) of the Qwen2.5-Omni token2wav streams measured; the
# pipeline's deploy default is 24 / 24 / 12
TOKEN2WAV_STREAMS = ((24, 0, 0), (24, 24, 0), (24, 24, 12), (24, 48, 24), (12, 48, 24))


def qwen2_5_token2wav_table(settings: SeamSettings) -> SeamTable:
    """The Qwen2.5-Omni token2wav rows: the tiny checkpoint's token2wav, whole against the stage's windows (the
    same noise)."""
    from omnipipe.models.qwen2_5_omni.modeling.token2wav_stream import (
        decode_whole,
        hop_samples,
        stream_windows,
        utterance_noise,
    )
    from omnipipe.models.qwen2_5_omni.weights.tiny import CODEC_CODES, tiny_token2wav

    model, conditioning, reference_mel = tiny_token2wav(settings.seed)
    model = model.to(settings.dtype)
    conditioning, reference_mel = conditioning.to(settings.dtype), reference_mel.to(settings.dtype)
    codes = torch.randint(0, CODEC_CODES, (1, settings.token2wav_codes),
                          generator=torch.Generator().manual_seed(settings.seed + 1))
    noise = utterance_noise(model, settings.seed).to(settings.dtype)
    with torch.inference_mode():
        start = time.perf_counter()
        whole = decode_whole(model, codes, conditioning, reference_mel, noise)
        whole_s = time.perf_counter() - start
        rows = []
        for chunk, left, right in TOKEN2WAV_STREAMS:
            start = time.perf_counter()
            pieces, decoded = stream_windows(model, codes, conditioning, reference_mel, noise, chunk, left, right)
            rows.append(seam_row("omnipipe Token2WavStream", chunk, left, whole, pieces, decoded,
                                 time.perf_counter() - start, right))
    dit = model.config.dit_config
    title = (f"Qwen2.5-Omni token2wav, streamed vs whole: {settings.token2wav_codes} random codes, seed "
             f"{settings.seed}, {str(settings.dtype).removeprefix('torch.')}, the tiny checkpoint's token2wav (DiT "
             f"{dit.num_hidden_layers} layers, blocks of {dit.block_size} mel frames, {dit.repeats} per code; "
             f"BigVGAN {hop_samples(model)} samples per mel frame)")
    note = (f"The whole decode took {whole_s:.2f} s. transformers decodes Qwen2.5-Omni's token2wav whole only "
            "(Qwen2_5OmniToken2WavModel.forward): it has no chunked decode to compare with.")
    return SeamTable(title, rows, note)


# Row sources, family -> ``(SeamSettings) -> SeamTable``: another vocoder's table is one more entry here.
ROW_SOURCES: dict[str, Callable[[SeamSettings], SeamTable]] = {
    "qwen3_omni": qwen3_code2wav_table,
    "qwen2_5_omni": qwen2_5_token2wav_table,
}


def published_exact_left_context() -> tuple[int, int]:
    """The exact left context and samples per frame of the published code2wav config (built on the meta device:
    no weights, no memory)."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    from omnipipe.models.qwen3_omni.modeling.code2wav_stream import code2wav_geometry

    with torch.device("meta"):
        geometry = code2wav_geometry(Qwen3OmniMoeCode2Wav(Qwen3OmniMoeCode2WavConfig()))
    return geometry.exact_left_context_frames, geometry.samples_per_frame


def format_report(tables: Sequence[SeamTable]) -> str:
    parts = []
    for table in tables:
        text = format_table(
            ["Method", "Chunk frames", "Left context", "Right context", "Frames decoded",
             "max|diff|/absmax at positions", "max|diff|/absmax as played", "Samples missing", "Wall s"],
            [[r.method, r.chunk_frames, r.left_context_frames, r.right_context_frames, r.frames_decoded,
              f"{r.error_at_positions:.2e}", f"{r.error_as_played:.2e}", r.samples_missing, r.wall_s]
             for r in table.rows],
            title=table.title)
        parts.append(f"{text}\n{table.note}" if table.note else text)
    return "\n\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench vocoder-seams", description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=[*ROW_SOURCES, "all"], default="all",
                        help="whose vocoder to measure (default all)")
    parser.add_argument("--frames", type=int, default=300,
                        help="random code frames for the Qwen3-Omni code2wav (default 300)")
    parser.add_argument("--token2wav-codes", type=int, default=96,
                        help="random codes for the Qwen2.5-Omni token2wav (default 96)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                        help="float64 (default) shows the seams apart from rounding; float32 is how a model serves")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers of the tiny model (default 2)")
    parser.add_argument("--sliding-window", type=int, default=72)
    parser.add_argument("--num-quantizers", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    for name in ("frames", "token2wav_codes", "layers", "sliding_window", "num_quantizers", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    torch.set_num_threads(args.threads)
    settings = SeamSettings(args.frames, args.seed, getattr(torch, args.dtype), args.layers, args.sliding_window,
                            args.num_quantizers, args.token2wav_codes)
    families = list(ROW_SOURCES) if args.family == "all" else [args.family]
    print(f"omnipipe bench vocoder-seams: {', '.join(families)}, {args.dtype}", file=sys.stderr)
    tables = {family: ROW_SOURCES[family](settings) for family in families}
    print(format_report(list(tables.values())))
    if args.json:
        write_json(args.json, {"meta": {"machine": machine_info(), "settings": {**asdict(settings),
                                                                                   "dtype": args.dtype}},
                               "rows": [{"family": family, **asdict(row)} for family, table in tables.items()
                                        for row in table.rows]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

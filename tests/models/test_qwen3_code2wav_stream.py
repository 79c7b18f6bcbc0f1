"""Qwen3-Omni code2wav streaming: windows with the exact left context concatenate to the whole decode, fewer
context frames do not, batching pads without changing a sample, and the seam bench prints its table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnipipe.bench.vocoder_seams import (
    SeamSettings,
    random_codes,
    seam_row,
    stream_with_chunked_decode,
    stream_with_decode_windows,
    tiny_code2wav,
)
from omnipipe.chunk.accumulation import FrameAccumulator, FrameChunkOptions
from omnipipe.models.qwen3_omni.modeling.code2wav_stream import (
    CodeWindow,
    code2wav_geometry,
    decode_window,
    decode_windows,
    exact_left_context_frames,
)
from omnipipe.util.field_error import FieldError

torch.set_num_threads(1)

FRAMES = 60
SETTINGS = SeamSettings(frames=FRAMES, sliding_window=8, num_quantizers=4, dtype=torch.float64)
# another structure: one upsampling step, two decoder blocks, three transformer layers, a narrower window
OTHER_STRUCTURE = {"upsampling_ratios": (2,), "upsample_rates": (4, 3), "num_hidden_layers": 3, "sliding_window": 5}


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_code2wav(SETTINGS)


@pytest.fixture(scope="module")
def codes() -> torch.Tensor:
    return random_codes(SETTINGS)


@pytest.fixture(scope="module")
def whole(model: torch.nn.Module, codes: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(codes)[0, 0]


def streamed_error(model: torch.nn.Module, codes: torch.Tensor, whole: torch.Tensor, chunk_frames: int,
                   left_context_frames: int) -> float:
    pieces, decoded = stream_with_decode_windows(model, codes, chunk_frames, left_context_frames)
    row = seam_row("omnipipe", chunk_frames, left_context_frames, whole, pieces, decoded, 0.0)
    assert row.samples_missing == 0
    assert row.error_as_played == row.error_at_positions  # pieces are back to back at their true positions
    return row.error_at_positions


def test_decode_length_is_frames_times_samples_per_frame_less_the_tail(model: torch.nn.Module) -> None:
    geometry = code2wav_geometry(model)
    assert geometry.samples_per_frame == 1920 and 0 < geometry.tail_samples < geometry.samples_per_frame
    with torch.inference_mode():
        for frames in (1, 2, 9):
            wave = model(random_codes(SETTINGS, frames))
            assert wave.shape[-1] == frames * geometry.samples_per_frame - geometry.tail_samples


def test_exact_context_counts_the_transformer_and_the_convolutions(model: torch.nn.Module) -> None:
    geometry = code2wav_geometry(model)
    assert geometry.transformer_context_frames == 2 * (8 - 1)
    assert exact_left_context_frames(model) == geometry.exact_left_context_frames > geometry.transformer_context_frames


@pytest.mark.parametrize("chunk_frames", [1, 7, 25, "exact"])
def test_windows_at_the_exact_context_equal_the_whole_decode(model: torch.nn.Module, codes: torch.Tensor,
                                                             whole: torch.Tensor, chunk_frames: int | str) -> None:
    exact = exact_left_context_frames(model)
    chunk = exact if chunk_frames == "exact" else chunk_frames
    assert streamed_error(model, codes, whole, chunk, exact) < 1e-6


def test_float32_windows_at_the_exact_context_equal_the_whole_decode() -> None:
    settings = SeamSettings(frames=FRAMES, sliding_window=8, num_quantizers=4, dtype=torch.float32)
    model, codes = tiny_code2wav(settings), random_codes(settings)
    with torch.inference_mode():
        whole = model(codes)[0, 0]
    assert streamed_error(model, codes, whole, 7, exact_left_context_frames(model)) < 1e-6


@pytest.mark.parametrize("structure", [{}, OTHER_STRUCTURE], ids=["published", "other"])
def test_the_exact_context_is_the_least_that_is_exact(structure: dict) -> None:
    model = tiny_code2wav(SETTINGS, **structure)
    codes = random_codes(SETTINGS)
    with torch.inference_mode():
        whole = model(codes)[0, 0]
    exact = exact_left_context_frames(model)
    assert streamed_error(model, codes, whole, 7, exact) < 1e-13
    assert streamed_error(model, codes, whole, 7, exact - 1) > 1e-12  # one frame less is no longer exact


def test_fewer_context_frames_give_a_measurable_error(model: torch.nn.Module, codes: torch.Tensor,
                                                      whole: torch.Tensor) -> None:
    assert streamed_error(model, codes, whole, 7, 4) > 1e-3


def test_batched_windows_of_different_lengths_equal_unbatched(model: torch.nn.Module, codes: torch.Tensor) -> None:
    exact = exact_left_context_frames(model)
    other = random_codes(SeamSettings(frames=FRAMES, seed=5, sliding_window=8, num_quantizers=4))[0]
    windows = [
        CodeWindow(codes[0, :, :9], 0, 0),  # a first window
        CodeWindow(codes[0, :, 30 - exact: 37], exact, 30),  # a middle window, the longest
        CodeWindow(other[:, FRAMES - 3 - 10: FRAMES], 10, FRAMES - 3),  # a short last window with less context
        CodeWindow(other[:, 30 - exact: 55], exact, 30),
    ]
    batched = decode_windows(model, windows)
    for window, samples in zip(windows, batched, strict=True):
        alone = decode_windows(model, [window])[0]
        assert samples.shape == alone.shape
        torch.testing.assert_close(samples, alone, rtol=0, atol=1e-12 * alone.abs().max().item())
    samples_per_frame = code2wav_geometry(model).samples_per_frame
    assert [s.numel() for s in batched[1:]] == [7 * samples_per_frame, 3 * samples_per_frame, 25 * samples_per_frame]


def test_decode_window_takes_a_batch_of_same_shaped_windows(model: torch.nn.Module, codes: torch.Tensor) -> None:
    pair = torch.cat([codes, random_codes(SeamSettings(seed=3, frames=FRAMES, num_quantizers=4))])[:, :, 10:30]
    out = decode_window(model, pair, context_frames=12, start_frame=22)
    assert out.shape == (2, 8 * code2wav_geometry(model).samples_per_frame)
    torch.testing.assert_close(out[1], decode_windows(model, [CodeWindow(pair[1], 12, 22)])[0], rtol=0, atol=0)


def test_frame_edge_chunks_stream_exactly(model: torch.nn.Module, codes: torch.Tensor, whole: torch.Tensor) -> None:
    """Chunks cut by the frame edge's accumulator, decoded one by one from the chunk dicts alone."""
    options = FrameChunkOptions(codec_chunk_frames=10, left_context_frames=exact_left_context_frames(model))
    accumulator = FrameAccumulator()
    frames = codes[0].numpy()
    pieces = []
    for start in range(0, FRAMES, 13):  # the talker's frames arrive in blocks of 13
        accumulator.add(frames[:, start: start + 13])
        is_last = start + 13 >= FRAMES
        for chunk in accumulator.cut(options, initial_chunk_frames=3, is_last=is_last):
            pieces.append(decode_windows(model, [CodeWindow.from_chunk(chunk)])[0])
    stream = torch.cat(pieces)
    assert stream.shape == whole.shape
    assert (stream - whole).abs().max().item() < 1e-6 * whole.abs().max().item()


def test_bad_windows_name_the_field(model: torch.nn.Module, codes: torch.Tensor) -> None:
    with pytest.raises(FieldError, match="context_frames") as error:
        decode_windows(model, [CodeWindow(codes[0, :, 5:10], 0, 5)])  # the previous window's tail needs context
    assert error.value.field == "context_frames"
    with pytest.raises(FieldError, match="context_frames"):
        decode_windows(model, [CodeWindow(codes[0, :, :10], 4, 2)])  # context before frame 0
    with pytest.raises(FieldError) as error:
        decode_windows(model, [CodeWindow(codes[0, :, :9], 0, 0), CodeWindow(codes[0, :3, :9], 0, 0)])
    assert error.value.field == "windows[1].frames"
    with pytest.raises(FieldError, match="integer codes"):
        decode_windows(model, [CodeWindow(codes[0, :, :9].double(), 0, 0)])
    with pytest.raises(FieldError) as error:
        CodeWindow.from_chunk({"frames": np.zeros((4, 5), np.int64), "context_frames": -1, "start_frame": 0})
    assert error.value.field == "context_frames"
    with pytest.raises(FieldError) as error:
        CodeWindow.from_chunk({"frames": np.zeros((4, 5), np.int64), "context_frames": 0})
    assert error.value.field == "start_frame"


def test_transformers_chunked_decode_leaves_a_gap_at_every_seam(model: torch.nn.Module, codes: torch.Tensor,
                                                                 whole: torch.Tensor) -> None:
    pieces, _ = stream_with_chunked_decode(model, codes, 25, 25)
    row = seam_row("chunked_decode", 25, 25, whole, pieces, 0, 0.0)
    assert row.samples_missing == 2 * code2wav_geometry(model).tail_samples  # three chunks, two seams
    assert row.error_as_played > 1e-2


def test_the_bench_prints_the_seam_table(capsys: pytest.CaptureFixture[str]) -> None:
    from omnipipe.cli.main import main

    assert main(["bench", "vocoder-seams", "--family", "qwen3_omni", "--frames", "60", "--sliding-window", "8",
                 "--num-quantizers", "4"]) == 0
    out = capsys.readouterr().out
    assert "Samples missing" in out and "max|diff|/absmax at positions" in out
    rows = [line for line in out.splitlines() if line.startswith("| omnipipe") or line.startswith("| transformers")]
    assert len(rows) == 6
    assert "needs 578 frames of left context" in out and "token2wav" not in out


@pytest.mark.slow
def test_the_bench_prints_both_families_tables(tmp_path) -> None:
    """``--family all``: the Qwen3 code2wav table and the Qwen2.5 token2wav one (the stage's windows against the
    whole decode: without right context the seams show, with the deploy's 24 left / 12 right codes they do not)."""
    import json

    from omnipipe.cli.main import main

    assert main(["bench", "vocoder-seams", "--family", "all", "--frames", "60", "--sliding-window", "8",
                 "--num-quantizers", "4", "--token2wav-codes", "48", "--json", str(tmp_path / "seams.json")]) == 0
    rows = json.loads((tmp_path / "seams.json").read_text())["rows"]
    assert [r["family"] for r in rows] == ["qwen3_omni"] * 7 + ["qwen2_5_omni"] * 5
    token2wav = {(r["chunk_frames"], r["left_context_frames"], r["right_context_frames"]): r
                 for r in rows if r["family"] == "qwen2_5_omni"}
    assert all(r["method"] == "omnipipe Token2WavStream" and r["samples_missing"] == 0 for r in token2wav.values())
    assert token2wav[(24, 0, 0)]["error_at_positions"] > 0.1 and token2wav[(24, 24, 0)]["error_at_positions"] > 0.1
    assert token2wav[(24, 24, 12)]["error_at_positions"] < 1e-5
    assert token2wav[(12, 48, 24)]["error_at_positions"] < 1e-9  # float64: wider context, nearer exact
    assert token2wav[(12, 48, 24)]["frames_decoded"] == 180  # 4 windows, context counted each time


def test_codes_outside_the_codebook_name_the_field(model: torch.nn.Module, codes: torch.Tensor) -> None:
    bad = codes[0, :, :9].clone()
    bad[1, 4] = model.config.codebook_size  # would read the next quantizer's embedding
    with pytest.raises(FieldError, match="codebook_size") as error:
        decode_windows(model, [CodeWindow(bad, 0, 0)])
    assert error.value.field == "frames"

"""Chunk sizes on a frame edge: a small first chunk, regular chunks, the rest last, with context windows."""

from __future__ import annotations

import numpy as np
import pytest

from omnipipe.chunk.accumulation import FrameAccumulator, FrameChunkOptions, choose_initial_chunk_frames


def frames(start: int, count: int) -> np.ndarray:
    return np.tile(np.arange(start, start + count, dtype=np.float32), (2, 1))


def feed(ctx: tuple[FrameChunkOptions, int], blocks: list[int]) -> list[dict]:
    acc, chunks, start = FrameAccumulator(), [], 0
    for i, count in enumerate(blocks):
        acc.add(frames(start, count))
        start += count
        chunks += acc.cut(*ctx, is_last=i == len(blocks) - 1)
    return chunks


def new_frames(chunk: dict) -> list[int]:
    window = chunk["frames"][0]
    return window[chunk["context_frames"]: len(window) - chunk["lookahead_frames"]].astype(int).tolist()


def test_first_regular_and_last_chunk_sizes() -> None:
    ctx = (FrameChunkOptions(codec_chunk_frames=25, left_context_frames=8, right_context_frames=0), 5)
    chunks = feed(ctx, [3, 3, 10, 30, 20, 1])  # 67 frames in uneven blocks
    sizes = [len(new_frames(c)) for c in chunks]
    assert sizes == [5, 25, 25, 12]
    assert [c["start_frame"] for c in chunks] == [0, 5, 30, 55]
    # every frame exactly once, in order
    assert sum((new_frames(c) for c in chunks), []) == list(range(67))
    # left context: none before the first chunk, then up to 8 frames
    assert [c["context_frames"] for c in chunks] == [0, 5, 8, 8]
    assert chunks[2]["frames"][0, :8].astype(int).tolist() == list(range(22, 30))


def test_lookahead_frames_delay_a_chunk_until_they_exist() -> None:
    ctx = (FrameChunkOptions(codec_chunk_frames=10, left_context_frames=4, right_context_frames=3), 4)
    acc = FrameAccumulator()
    acc.add(frames(0, 6))
    assert acc.cut(*ctx, is_last=False) == []  # 4 due + 3 lookahead > 6
    acc.add(frames(6, 1))
    (first,) = acc.cut(*ctx, is_last=False)
    assert new_frames(first) == [0, 1, 2, 3] and first["lookahead_frames"] == 3
    acc.add(frames(7, 20))
    chunks = acc.cut(*ctx, is_last=True)
    assert sum((new_frames(c) for c in [first, *chunks]), []) == list(range(27))
    assert chunks[-1]["lookahead_frames"] == 0


def test_last_chunk_flushes_a_short_tail() -> None:
    ctx = (FrameChunkOptions(codec_chunk_frames=25, left_context_frames=2, right_context_frames=0), 25)
    assert [len(new_frames(c)) for c in feed(ctx, [7])] == [7]
    assert feed(ctx, [0]) == []


@pytest.mark.parametrize("active, expected", [(1, 5), (2, 8), (8, 25), (30, 25)])
def test_auto_initial_chunk_grows_with_load(active: int, expected: int) -> None:
    assert choose_initial_chunk_frames("auto", 25, active, max_num_seqs=8) == expected


def test_explicit_initial_chunk_wins_and_is_capped() -> None:
    assert choose_initial_chunk_frames(3, 25, 8, 8) == 3
    assert choose_initial_chunk_frames(100, 25, 1, 8) == 25


ADAPTIVE = FrameChunkOptions(codec_chunk_frames=10, left_context_frames=4, right_context_frames=2,
                             adaptive_chunk=True, max_codec_chunk_frames=40, target_lead_s=1.0, frame_rate_hz=10.0)


def test_adaptive_chunks_grow_when_the_audio_falls_behind_playback() -> None:
    acc = FrameAccumulator()
    acc.add(frames(0, 5))
    (first,) = acc.cut(ADAPTIVE, 3, is_last=False, now=100.0)  # playback starts here
    assert len(new_frames(first)) == 3
    acc.add(frames(5, 200))
    # 0.3 s of audio cut, 5 s later: far behind -> the largest chunks
    behind = acc.cut(ADAPTIVE, 3, is_last=False, now=105.0)
    assert [len(new_frames(c)) for c in behind] == [40] * 5
    assert [c["context_frames"] for c in behind] == [3, 4, 4, 4, 4]
    assert all(c["lookahead_frames"] == 2 for c in behind)
    # 20.3 s cut at 6 s: ahead by more than target_lead_s -> back to codec_chunk_frames
    acc.add(frames(205, 60))
    ahead = acc.cut(ADAPTIVE, 3, is_last=True, now=106.0)
    assert [len(new_frames(c)) for c in ahead] == [10] * 6 + [2]
    assert sum((new_frames(c) for c in [first, *behind, *ahead]), []) == list(range(265))


def test_adaptive_size_is_linear_in_the_lead_and_off_by_default() -> None:
    leads = (None, -3.0, 0.0, 0.5, 1.0, 4.0)
    assert [ADAPTIVE.regular_chunk_frames(lead) for lead in leads] == [10, 40, 40, 25, 10, 10]
    fixed = FrameChunkOptions(codec_chunk_frames=10, max_codec_chunk_frames=40, frame_rate_hz=10.0)
    assert fixed.regular_chunk_frames(-3.0) == 10


def test_window_frames_count_the_context_decoded_again() -> None:
    ctx = (FrameChunkOptions(codec_chunk_frames=25, left_context_frames=10, right_context_frames=10), 25)
    acc = FrameAccumulator()
    acc.add(frames(0, 100))
    chunks = acc.cut(*ctx, is_last=True)
    assert acc.window_frames == sum(c["frames"].shape[1] for c in chunks) == 100 + 3 * 10 + 3 * 10

"""``omnipipe bench offline --pipeline qwen3_omni`` end to end on the tiny checkpoint at c=1,2 with a few tokens:
both settings' rows and the side-by-side ratios printed."""

from __future__ import annotations

import pytest

from omnipipe.bench import offline
from omnipipe.bench.omni_load import StreamRecord
from omnipipe.models.qwen3_omni.weights.tiny import write_tiny_checkpoint


def test_a_stream_is_real_time_only_if_no_packet_arrives_after_the_audio_before_it_ran_out() -> None:
    kept = StreamRecord(0.0, packets=[(1.0, 0.5), (1.4, 0.5), (1.9, 0.5)])
    late = StreamRecord(0.0, packets=[(1.0, 0.5), (1.6, 0.5)])
    assert kept.kept_in_real_time() is True and late.kept_in_real_time() is False
    assert StreamRecord(0.0).kept_in_real_time() is None


@pytest.mark.slow
def test_bench_offline_qwen3_prints_batched_beside_per_request(tmp_path, capsys) -> None:
    model = write_tiny_checkpoint(tmp_path / "ckpt")
    assert offline.main(["--pipeline", "qwen3_omni", "--model", str(model), "--concurrency", "1,2", "--rounds", "1",
                         "--max-tokens", "4", "--talker-frames", "4"]) == 0
    out = capsys.readouterr().out
    for column in ("Thinker tok/s", "Talker frames/s", "Real-time streams", "TTFP p50 (ms)", "TTFP p99 (ms)",
                   "on/off"):
        assert column in out
    assert "| on " in out and "| off " in out

"""``bench offline``'s TTFP-over-floor figures and its seed 001 preset, on made-up rows (no models)."""

from __future__ import annotations

import pytest

from omnipipe.api.outputs import RequestMetrics
from omnipipe.bench import offline


def metrics(ttfp_s: float, windows: int, frames: int) -> RequestMetrics:
    return RequestMetrics(e2e_s=2 * ttfp_s, ttft_s=0.1, tpot_s=0.05, itl_s=[0.05], ttfp_s=ttfp_s,
                          audio_duration_s=1.0, rtf=2 * ttfp_s, num_output_tokens=10,
                          stages={"talker": {"window_frames": windows, "compute_s": 0.2},
                                  "code2wav": {"units": frames, "compute_s": 0.1}}, edges={})


def test_floor_ratio_pairs_each_request_with_its_own_prompt() -> None:
    row = offline._row("async chunk on", 4, [metrics(3.0, 90, 50), metrics(1.0, 45, 25)], wall_s=2.0)
    row["prompts_asked"], row["ttfp_s_each"] = ["long", "short"], [3.0, 1.0]
    floors = {"per_prompt": {"long": {"total_s": 2.0}, "short": {"total_s": 0.5}}}
    offline.add_floor([row], floors)
    assert row["floor_ms_mean"] == pytest.approx(1250.0)
    assert row["ttfp_over_floor"]["median"] == pytest.approx((1.5 + 2.0) / 2)
    assert row["vocoder_frames_per_audio_frame"] == pytest.approx(135 / 75)
    assert row["throughput_rps"] == pytest.approx(1.0)
    assert row["stage_compute_ms_mean"] == pytest.approx({"code2wav": 100.0, "talker": 200.0})
    report = offline.format_report([row])
    assert "TTFP/floor p50" in report and "1.75" in report


def test_on_off_throughput_ratio_is_reported_per_concurrency() -> None:
    on = offline._row("async chunk on", 10, [metrics(1.0, 45, 25)], wall_s=4.0)
    off = offline._row("async chunk off", 10, [metrics(2.0, 25, 25)], wall_s=2.0)
    assert "req/s async chunk on / off at concurrency 10: 0.500" in offline.format_report([on, off])


def test_seed001_preset_and_its_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}

    async def fake_rows(pipeline, async_chunk, prompts, concurrencies, max_tokens, deploy=None):
        seen.update(prompts=prompts, concurrencies=concurrencies, max_tokens=max_tokens)
        return []

    monkeypatch.setattr(offline, "_engine_rows", fake_rows)
    monkeypatch.setattr(offline, "first_packet_floors", lambda *a: seen.setdefault("floor", True) and None)
    offline.main(["--seed001", "--settings", "on", "--no-baseline"])
    assert seen["concurrencies"] == [1, 4, 10] and seen["max_tokens"] == 100 and len(seen["prompts"]) == 50
    assert seen["prompts"][0] in offline.LONG_QUESTIONS and seen["floor"] is True
    seen.clear()
    offline.main(["--seed001", "--settings", "on", "--no-baseline", "--num-prompts", "3", "--concurrency", "4"])
    assert seen["concurrencies"] == [4] and len(seen["prompts"]) == 3
    seen.clear()
    offline.main(["--settings", "on", "--no-baseline"])
    assert seen["concurrencies"] == [1, 4] and seen["max_tokens"] == 40 and "floor" not in seen

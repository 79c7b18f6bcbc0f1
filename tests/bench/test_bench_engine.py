"""The engine benchmark runs end to end in quick mode and writes every section; the report helpers are exact."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
import pytest

from omnipipe.bench.engine import expected_ttfp_ms, main, ttfp_prompts
from omnipipe.bench.report import format_table, mean, median, percentile, summarize
from tests.conftest import child_processes


def numbers(value: Any) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, dict):
        return [n for item in value.values() for n in numbers(item)]
    if isinstance(value, list):
        return [n for item in value for n in numbers(item)]
    return []


def positive(*values: Any) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


@pytest.mark.slow
def test_quick_run_prints_every_table_and_writes_every_section(tmp_path, capsys) -> None:
    path = tmp_path / "engine.json"
    before = {p.pid for p in child_processes()}  # servers other test modules keep running
    assert main(["--quick", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    for title in ("Control-plane hop latency", "Hops of a request through the toy stages", "Engine per-token overhead",
                  "Relay throughput",
                  "TTFP, async chunk on vs off", "expected on/off"):
        assert title in printed
    assert "| async_chunk | concurrency | prompts | mean E2E ms | mean TTFT ms | mean TTFP ms |" in printed

    data = json.loads(path.read_text())
    assert set(data) >= {"meta", "latency", "relay", "ttfp"}
    assert all(math.isfinite(n) for n in numbers(data))

    hops = data["latency"]["hops"]
    assert len(hops) == 4 and [h["framework"] for h in hops] == [False, True, True, False]
    assert all(positive(h["p50_ms"], h["p99_ms"], h["mean_ms"], h["frame_bytes"]) for h in hops)
    pipeline_hops = data["latency"]["pipeline_hops"]
    assert [r["hop"] for r in pipeline_hops["rows"]] == ["caller->thinker", "thinker->talker", "talker->code2wav",
                                                         "code2wav->caller"]
    assert all(positive(r["p50_ms"], r["p99_ms"], r["mean_ms"]) and len(r["samples_ms"]) == pipeline_hops["requests"]
               for r in pipeline_hops["rows"])
    assert positive(pipeline_hops["hops_total_p50_ms"], pipeline_hops["e2e_p50_ms"])
    for row in pipeline_hops["rows"]:
        assert f"| {row['hop']} " in printed
    assert "| raw ZMQ hop (zmq only: same bytes, no codec) " in printed
    assert "| raw ZMQ hop (zmq only, both ends idle 3 ms before each) " in printed
    token = data["latency"]["token_overhead"]
    assert positive(token["itl_mean_ms"], token["itl_median_ms"], token["itl_p99_ms"],
                    token["thinker_compute_per_token_ms"])

    relay = data["relay"]
    assert {r["backend"] for r in relay["rows"]} == {"inline", "shm", "shm one-off", "shm zero-copy", "gloo"}
    assert {r["size_bytes"] for r in relay["rows"]} == {m["size_bytes"] for m in relay["memcpy"]}
    assert all(positive(m["gbps"], m["best_gbps"], m["median_ms"]) for m in relay["memcpy"])
    for row in relay["rows"]:
        assert positive(row["gbps"], row["best_gbps"], row["pct_of_memcpy"], row["median_ms"], row["mean_ms"])
        assert row["phases_mean_ms"]["write"] > 0 and row["phases_mean_ms"]["read"] > 0
        assert positive(row["read_pct_of_memcpy"])
    assert "shm copying receive (read_payload) at 1 MiB" in printed

    ttfp = data["ttfp"]
    assert {(r["async_chunk"], r["concurrency"]) for r in ttfp["rows"]} == {(a, c) for a in (True, False)
                                                                            for c in (1, 2)}
    for row in ttfp["rows"]:
        assert row["prompts"] == 2
        assert positive(*(row[f"{m}_{s}_ms"] for m in ("e2e", "ttft", "ttfp") for s in ("mean", "median", "p99")))
    assert [r["concurrency"] for r in ttfp["ratios"]] == [1, 2]
    assert all(positive(r["ratio"]) for r in ttfp["ratios"])
    assert positive(ttfp["expected"]["ratio"], ttfp["expected"]["on_ms"], ttfp["expected"]["off_ms"])

    # nothing left behind: no peer or stage process, no shared-memory segment
    assert [p for p in child_processes() if p.pid not in before] == []
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("omnipipe-bench")]


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(SystemExit):
        main(["--num-prompts", "0"])
    with pytest.raises(SystemExit):
        main(["--sections", "nope"])


def test_stats_match_numpy() -> None:
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    assert mean(values) == pytest.approx(np.mean(values))
    assert median(values) == pytest.approx(np.median(values))
    for pct in (0, 25, 50, 99, 100):
        assert percentile(values, pct) == pytest.approx(np.percentile(values, pct))
    stats = summarize([0.001, 0.002, 0.003], scale=1e3)
    assert stats["count"] == 3 and stats["mean"] == pytest.approx(2.0) and stats["max"] == pytest.approx(3.0)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_table_aligns_columns() -> None:
    table = format_table(["name", "value"], [["a", 1.5], ["longer", 12.25], ["none", None]], digits=1, title="T")
    lines = table.splitlines()
    assert lines[0] == "T"
    assert len({len(line) for line in lines[1:]}) == 1
    assert lines[3] == "| a      |   1.5 |"
    assert lines[5] == "| none   |     - |"


def test_expected_ratio_follows_the_stage_delays() -> None:
    prompts = ttfp_prompts(3)
    expected = expected_ttfp_ms(prompts, 20, 20, 10)
    first_word = prompts[0].index(" ") + 1
    assert expected["on_ms"] == pytest.approx(first_word * 20 + 30)
    assert expected["off_ms"] == pytest.approx((len(prompts[0]) + 1) * 20 + 30)
    assert expected["ratio"] == pytest.approx(expected["on_ms"] / expected["off_ms"])

"""``omnipipe bench serve`` against a live toy server: the table and JSON have their shape (no timing thresholds)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from omnipipe.bench.serve import (
    METRICS,
    arrival_times,
    main,
    main_headers,
    parse_goodput,
    parse_metric_percentiles,
    percentile_headers,
)
from omnipipe.bench.serve_datasets import load_prompts
from omnipipe.cli.main import main as cli_main
from tests.server.conftest import API_KEY, TOY_DEPLOY, ServerProcess, running_server

pytestmark = pytest.mark.slow  # bench serve end to end against a running server


@pytest.fixture(scope="module")
def toy_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_server("toy", TOY_DEPLOY, tmp_path_factory.mktemp("bench-toy-server"), 120) as server:
        yield server


def finite_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def header_line(printed: str, column: str) -> str:
    return next(line for line in printed.splitlines() if line.startswith("| Max_Concurrency") and column in line)


def table_row(printed: str, *first: str) -> list[str]:
    """The printed table row whose first cells are ``first``."""
    return next(cells(line) for line in printed.splitlines()
                if line.startswith("| ") and cells(line)[:len(first)] == list(first))


def test_run_prints_both_tables_and_writes_every_row(toy_server: ServerProcess, tmp_path: Path, capsys) -> None:
    path = tmp_path / "serve.json"
    code = main(["--base-url", toy_server.url, "--api-key", API_KEY, "--num-prompts", "4",
                 "--max-concurrency", "1,2", "--max-tokens", "20", "--json", str(path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert cells(header_line(printed, "Completed")) == main_headers(METRICS, wer=False)
    assert cells(header_line(printed, "Metric")) == percentile_headers([99])
    # the default percentile rows: ttft, tpot, itl as vLLM, plus ttfp with spoken answers; one set per level
    assert [cells(line)[2] for line in printed.splitlines() if line.startswith("| ") and "(ms)" in cells(line)[2]
            ] == ["TTFT (ms)", "TPOT (ms)", "ITL (ms)", "TTFP (ms)"] * 2

    data = json.loads(path.read_text())
    assert data["meta"]["model"] == "toy" and data["meta"]["modalities"] == ["text", "audio"]
    assert [row["max_concurrency"] for row in data["rows"]] == [1, 2]
    for row in data["rows"]:
        assert row["prompts"] == row["completed"] == 4 and row["failed"] == 0 and not row["errors"]
        assert finite_positive(row["throughput_rps"]) and finite_positive(row["audio_s_mean"])
        for name in METRICS:
            stats = row[name]
            assert set(stats) == {"count", "mean", "median", "std", "min", "max", "p99"}, name
            assert all(math.isfinite(v) and v >= 0 for v in stats.values()), (name, stats)
            assert stats["min"] <= stats["median"] <= stats["p99"] <= stats["max"], (name, stats)
        assert row["e2el"]["count"] == 4 and row["ttft"]["count"] == 4 and row["ttfp"]["count"] == 4


def test_text_only_file_dataset_through_the_cli(toy_server: ServerProcess, tmp_path: Path, capsys) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text('{"prompt": "first question"}\n\nplain line question\n')
    path = tmp_path / "serve.json"
    code = cli_main(["bench", "serve", "--base-url", toy_server.url, "--api-key", API_KEY, "--num-prompts", "3",
                     "--max-concurrency", "2", "--dataset", str(dataset), "--text-only", "--warmup", "0",
                     "--json", str(path)])
    assert code == 0, capsys.readouterr()
    row = json.loads(path.read_text())["rows"][0]
    assert row["completed"] == 3 and row["ttfp"] is None and row["rtf"] is None and row["e2el"]["count"] == 3
    assert load_prompts(str(dataset), 3, 0) == ["first question", "plain line question", "first question"]


def test_wrong_api_key_counts_failures(toy_server: ServerProcess, tmp_path: Path, capsys) -> None:
    code = main(["--base-url", toy_server.url, "--api-key", "wrong", "--model", "toy", "--num-prompts", "2",
                 "--max-concurrency", "1", "--warmup", "0"])
    printed = capsys.readouterr().out
    assert code == 1 and "2 of 2 requests failed" in printed and "HTTP 401" in printed


def test_bad_arguments_are_usage_errors(capsys) -> None:
    for argv, flag in ((["--max-concurrency", "0"], "--max-concurrency"),
                       (["--max-concurrency", "a,b"], "--max-concurrency"), (["--num-prompts", "0"], "--num-prompts"),
                       (["--dataset", "/no/such/file"], "--dataset"),
                       (["--percentile-metrics", "ttft,latency"], "--percentile-metrics"),
                       (["--percentile-metrics", "ttfp", "--text-only"], "--percentile-metrics"),
                       (["--endpoint", "/v1/audio/speech", "--percentile-metrics", "ttft"], "--percentile-metrics"),
                       (["--metric-percentiles", "50,101"], "--metric-percentiles"),
                       (["--metric-percentiles", "p99"], "--metric-percentiles"),
                       (["--endpoint", "/v1/audio/speech", "--goodput", "ttft:100"], "--goodput"),
                       (["--endpoint", "/v1/audio/transcriptions", "--dataset", "random"], "--dataset"),
                       (["--endpoint", "/v1/realtime", "--dataset", "random"], "--dataset"),
                       (["--endpoint", "/v1/audio/speech", "--dataset", "spoken"], "--dataset"),
                       (["--endpoint", "/v1/models"], "--endpoint"),
                       (["--save-result", "--result-filename", "x.json", "--max-concurrency", "1,2"],
                        "--result-filename"),
                       (["--metadata", "novalue"], "--metadata")):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
        assert flag in capsys.readouterr().err, argv
    assert len(load_prompts("random", 7, 1)) == 7 and load_prompts("random", 5, 3) == load_prompts("random", 5, 3)
    assert parse_metric_percentiles("50, 90,99.9") == [50.0, 90.0, 99.9]


def test_open_loop_rates_and_goodput(toy_server: ServerProcess, tmp_path: Path, capsys) -> None:
    """Every concurrency level at every rate; the arrivals are spread as asked; goodput counts the requests that met
    every bound (a bound no request can meet gives 0, one every request meets gives the throughput)."""
    path = tmp_path / "serve.json"
    code = main(["--base-url", toy_server.url, "--api-key", API_KEY, "--num-prompts", "6", "--max-concurrency", "4",
                 "--request-rate", "2,inf", "--goodput", "ttft:60000", "rtf:1000", "--warmup", "0",
                 "--max-tokens", "10", "--json", str(path)])
    assert code == 0, capsys.readouterr().out
    rows = json.loads(path.read_text())["rows"]
    assert [(r["max_concurrency"], r["request_rate"]) for r in rows] == [(4, 2.0), (4, None)]
    paced, burst = rows
    assert paced["duration_s"] >= arrival_times(6, 2.0, 1.0, 0)[-1]  # the seeded schedule: its last arrival
    for row in rows:
        assert row["goodput_rps"] == row["throughput_rps"] > 0
    code = main(["--base-url", toy_server.url, "--api-key", API_KEY, "--num-prompts", "2", "--max-concurrency", "2",
                 "--goodput", "ttft:0.001", "--warmup", "0", "--json", str(path)])
    assert json.loads(path.read_text())["rows"][0]["goodput_rps"] == 0


def test_arrivals_and_goodput_bounds() -> None:
    assert arrival_times(3, float("inf"), 1.0, 0) == [0.0, 0.0, 0.0]
    times = arrival_times(2000, 4.0, 1.0, 7)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert times[0] == 0 and all(g >= 0 for g in gaps) and abs(sum(gaps) / len(gaps) - 0.25) < 0.03
    bursty_times = arrival_times(2000, 4.0, 0.2, 7)
    bursty = [b - a for a, b in zip(bursty_times, bursty_times[1:], strict=False)]

    def spread(values: list[float]) -> float:  # coefficient of variation
        m = sum(values) / len(values)
        return (sum((v - m) ** 2 for v in values) / len(values)) ** 0.5 / m

    assert abs(sum(bursty) / len(bursty) - 0.25) < 0.05 and spread(bursty) > 1.5 * spread(gaps)  # same rate, burstier
    assert parse_goodput(["ttft:500", "rtf:1"]) == {"ttft": 500.0, "rtf": 1.0}
    for bad in (["speed:1"], ["ttft:fast"], ["ttft:0"]):
        with pytest.raises(ValueError, match="--goodput"):
            parse_goodput(bad)


def test_percentile_metrics_and_percentiles_in_the_table_and_the_json(toy_server: ServerProcess, tmp_path: Path,
                                                                      capsys) -> None:
    path = tmp_path / "serve.json"
    code = main(["--base-url", toy_server.url, "--api-key", API_KEY, "--num-prompts", "5", "--max-concurrency", "2",
                 "--max-tokens", "12", "--warmup", "0", "--disable-tqdm", "--percentile-metrics", "e2el,ttfp,rtf",
                 "--metric-percentiles", "50,90,99.9", "--json", str(path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert cells(header_line(printed, "Metric")) == ["Max_Concurrency", "Rate (req/s)", "Metric", "Mean", "Median",
                                                     "Std", "P50", "P90", "P99.9"]
    row = json.loads(path.read_text())["rows"][0]
    assert json.loads(path.read_text())["meta"]["percentile_metrics"] == ["e2el", "ttfp", "rtf"]
    for metric, label in (("e2el", "E2EL (ms)"), ("ttfp", "TTFP (ms)"), ("rtf", "RTF")):
        stats = row[metric]
        assert stats["min"] <= stats["p50"] <= stats["p90"] <= stats["p99.9"] <= stats["max"], stats
        assert stats["p50"] == stats["median"] and stats["count"] == 5
        printed_row = table_row(printed, "2", "inf", label)
        assert printed_row[3:] == [f"{stats[k]:.2f}" for k in ("mean", "median", "std", "p50", "p90", "p99.9")]
    assert "TTFT (ms)" not in [cells(line)[2] for line in printed.splitlines() if line.startswith("| ")]


# The keys vllm bench serve writes with --save-result: vllm/benchmarks/serve.py in vllm-project/vllm (commit
# 009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1): main_async's result_json (setup and traffic), benchmark()'s result
# dict (without --save-detailed, main_async deletes input_lens, output_lens, start_times, ttfts, itls,
# generated_texts and errors), and process_one_metric's mean_/median_/std_/pXX_<metric>_ms per selected metric.
VLLM_SETUP = {"date": str, "endpoint_type": str, "backend": str, "label": (str, type(None)), "model_id": str,
              "tokenizer_id": (str, type(None)), "num_prompts": int, "request_rate": (float, int, str),
              "burstiness": float, "max_concurrency": (int, type(None))}
VLLM_RESULT = {"duration": float, "completed": int, "failed": int, "total_input_tokens": int,
               "total_output_tokens": int, "request_throughput": float, "request_goodput": (float, type(None)),
               "output_throughput": float, "total_token_throughput": float, "latencies": list, "queue_times": list,
               "max_output_tokens_per_s": float, "max_concurrent_requests": int, "rtfx": float}
VLLM_DETAILED = {"input_lens": list, "output_lens": list, "ttfts": list, "itls": list, "start_times": list,
                 "generated_texts": list, "errors": list}


def test_save_result_has_vllm_keys_and_types_and_agrees_with_the_table(toy_server: ServerProcess, tmp_path: Path,
                                                                        capsys) -> None:
    code = main(["--base-url", toy_server.url, "--api-key", API_KEY, "--num-prompts", "4", "--max-concurrency", "2",
                 "--request-rate", "inf,20", "--max-tokens", "12", "--warmup", "0", "--disable-tqdm",
                 "--goodput", "ttft:60000", "--metric-percentiles", "90,99", "--save-result", "--save-detailed",
                 "--result-dir", str(tmp_path), "--metadata", "build=test"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    files = sorted(tmp_path.glob("openai-chat-*qps-concurrency2-toy-*.json"))
    assert [f.name.split("-")[2] for f in files] == ["20.0qps", "infqps"]
    selected = ["ttft", "tpot", "itl", "ttfp"]  # the default: vLLM's ttft,tpot,itl plus ttfp with spoken answers
    for file in files:
        result = json.loads(file.read_text())
        stat_keys = {f"{s}_{m}_ms": float for m in selected for s in ("mean", "median", "std", "p90", "p99")}
        expected = {**VLLM_SETUP, **VLLM_RESULT, **VLLM_DETAILED, **stat_keys, "build": str, "omnipipe": dict}
        assert set(result) == set(expected), set(result) ^ set(expected)
        for key, kind in expected.items():
            assert isinstance(result[key], kind), (key, result[key])
        assert result["backend"] == result["endpoint_type"] == "openai-chat" and result["model_id"] == "toy"
        assert result["num_prompts"] == result["completed"] == 4 and result["failed"] == 0
        assert result["max_concurrency"] == 2 and result["errors"] == [""] * 4
        assert all(len(result[k]) == 4 for k in ("latencies", "queue_times", "ttfts", "itls", "generated_texts"))
        assert all(text for text in result["generated_texts"]) and sum(result["output_lens"]) > 0
        assert 1 <= result["max_concurrent_requests"] <= 2 and result["max_output_tokens_per_s"] >= 1
        rate = "inf" if result["request_rate"] == "inf" else f"{result['request_rate']:.2f}"
        main_row = table_row(printed, "2", rate)
        headers = cells(header_line(printed, "Completed"))
        assert float(main_row[headers.index("req/s")]) == pytest.approx(result["request_throughput"], abs=0.006)
        assert float(main_row[headers.index("Goodput (req/s)")]) == pytest.approx(result["request_goodput"],
                                                                                  abs=0.006)
        assert float(main_row[headers.index("Output tok/s")]) == pytest.approx(result["output_throughput"],
                                                                               abs=0.006)
        for metric, label in (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"), ("itl", "ITL (ms)"),
                              ("ttfp", "TTFP (ms)")):
            printed_row = table_row(printed, "2", rate, label)
            assert printed_row[3:] == [f"{result[f'{s}_{metric}_ms']:.2f}"
                                       for s in ("mean", "median", "std", "p90", "p99")], metric
        assert result["mean_ttft_ms"] == pytest.approx(sum(result["ttfts"]) / 4 * 1000)
        assert result["omnipipe"]["endpoint"] == "/v1/chat/completions" and len(result["omnipipe"]["ttfps"]) == 4
    # without --save-detailed the per-request lists stay out, as in vLLM; --result-filename names the one file
    code = main(["--base-url", toy_server.url, "--api-key", API_KEY, "--num-prompts", "2", "--max-concurrency", "1",
                 "--warmup", "0", "--disable-tqdm", "--save-result", "--result-dir", str(tmp_path / "one"),
                 "--result-filename", "run.json", "--label", "mine"])
    assert code == 0, capsys.readouterr().out
    result = json.loads((tmp_path / "one" / "run.json").read_text())
    assert not set(VLLM_DETAILED) & set(result) and result["label"] == "mine" and result["request_goodput"] is None


def test_speech_endpoint_measures_first_audio_and_rtf(toy_server: ServerProcess, tmp_path: Path, capsys) -> None:
    path = tmp_path / "serve.json"
    code = main(["--base-url", toy_server.url, "--api-key", API_KEY, "--endpoint", "/v1/audio/speech",
                 "--num-prompts", "3", "--max-concurrency", "2", "--warmup", "0", "--disable-tqdm",
                 "--goodput", "rtf:1000", "--json", str(path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert cells(header_line(printed, "Completed"))[4:7] == ["Mean E2EL (ms)", "Mean TTFP (ms)", "Mean RTF"]
    data = json.loads(path.read_text())
    row = data["rows"][0]
    assert data["meta"]["endpoint"] == "/v1/audio/speech" and data["meta"]["modalities"] == ["audio"]
    assert row["completed"] == 3 and row["ttft"] is None and row["itl"] is None
    assert row["ttfp"]["count"] == row["rtf"]["count"] == row["e2el"]["count"] == 3
    assert row["ttfp"]["max"] <= row["e2el"]["max"] and finite_positive(row["audio_s_mean"])
    assert row["goodput_rps"] == row["throughput_rps"] > 0


def test_progress_bar_on_stderr_unless_disabled(toy_server: ServerProcess, capsys) -> None:
    argv = ["--base-url", toy_server.url, "--api-key", API_KEY, "--num-prompts", "3", "--max-concurrency", "1",
            "--warmup", "0", "--max-tokens", "5"]
    assert main(argv) == 0
    assert "3/3" in capsys.readouterr().err
    assert main([*argv, "--disable-tqdm"]) == 0
    assert "3/3" not in capsys.readouterr().err


def test_spoken_questions_are_made_once_and_failures_keep_their_error(toy_server: ServerProcess, tmp_path: Path,
                                                                      capsys) -> None:
    """The toy pipeline reads text aloud but takes no audio: the spoken questions are made (and cached), and every
    realtime turn and spoken chat question fails with the server's reason, counted, never dropped."""
    cache = tmp_path / "spoken"
    path = tmp_path / "serve.json"
    base = ["--base-url", toy_server.url, "--api-key", API_KEY, "--num-prompts", "3", "--max-concurrency", "2",
            "--warmup", "0", "--disable-tqdm", "--spoken-cache-dir", str(cache), "--json", str(path)]
    assert main([*base, "--endpoint", "/v1/realtime"]) == 1
    printed = capsys.readouterr().out
    assert "3 of 3 requests failed" in printed and "unsupported_modality" in printed, printed
    made = {f: f.stat().st_mtime_ns for f in cache.glob("*.pcm")}
    assert len(made) == len(set(load_prompts("spoken", 3, 0))) and all(f.stat().st_size > 0 for f in made)
    assert main([*base, "--dataset", "spoken"]) == 1  # chat with the spoken questions
    row = json.loads(path.read_text())["rows"][0]
    assert row["failed"] == 3 and row["completed"] == 0 and "HTTP 400" in row["errors"][0]
    assert "does not take audio input" in row["errors"][0]
    assert {f: f.stat().st_mtime_ns for f in cache.glob("*.pcm")} == made  # read from the cache, not made again


def test_every_flag_is_documented() -> None:
    """docs/benchmarks.md has a row for every flag of the parser, and names no flag the parser lacks."""
    from omnipipe.bench.serve import build_parser

    flags = {o for action in build_parser()._actions for o in action.option_strings if o.startswith("--")} - {"--help"}
    doc = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text()
    section = doc[doc.index("### Flags"):doc.index("### The result file")]
    documented = {cell.strip("`").split()[0] for cell in re.findall(r"^\| (`--[^|]+`) \|", section, re.M)}
    assert documented == flags


def test_an_sse_line_gives_its_event_none_or_the_end_and_a_stream_error_raises() -> None:
    from omnipipe.bench.serve_endpoints import EndOfStream, StreamEventError, sse_event

    assert sse_event('data: {"choices": []}') == {"choices": []}
    assert sse_event("") is None and sse_event(": keep-alive") is None and sse_event("event: x") is None
    with pytest.raises(EndOfStream):
        sse_event("data: [DONE]")
    with pytest.raises(StreamEventError, match="stream error: stage down"):
        sse_event('data: {"error": {"message": "stage down"}}')

"""``omnipipe bench serve`` against a live toy server: the table and JSON have their shape (no timing thresholds)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from omnipipe.bench.serve import DETAIL_HEADERS, MAIN_HEADERS, arrival_times, load_prompts, main, parse_goodput
from omnipipe.cli.main import main as cli_main
from tests.server.conftest import API_KEY, TOY_DEPLOY, ServerProcess, running_server


@pytest.fixture(scope="module")
def toy_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_server("toy", TOY_DEPLOY, tmp_path_factory.mktemp("bench-toy-server"), 120) as server:
        yield server


def finite_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_run_prints_both_tables_and_writes_every_row(toy_server: ServerProcess, tmp_path: Path, capsys) -> None:
    path = tmp_path / "serve.json"
    code = main(["--base-url", toy_server.url, "--api-key", API_KEY, "--num-prompts", "4",
                 "--max-concurrency", "1,2", "--max-tokens", "20", "--json", str(path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert all(h in printed for h in DETAIL_HEADERS)
    header_line = next(line for line in printed.splitlines() if line.startswith("| Max_Concurrency | Prompts"))
    assert [c.strip() for c in header_line.strip("|").split("|")] == MAIN_HEADERS

    data = json.loads(path.read_text())
    assert data["meta"]["model"] == "toy" and data["meta"]["modalities"] == ["text", "audio"]
    assert [row["max_concurrency"] for row in data["rows"]] == [1, 2]
    for row in data["rows"]:
        assert row["prompts"] == row["completed"] == 4 and row["failed"] == 0 and not row["errors"]
        assert finite_positive(row["throughput_rps"]) and finite_positive(row["audio_s_mean"])
        for name in ("e2e", "ttft", "tpot", "itl", "ttfp", "rtf"):
            stats = row[name]
            assert set(stats) == {"count", "mean", "median", "p99", "min", "max"}, name
            assert all(math.isfinite(v) and v >= 0 for v in stats.values()), (name, stats)
            assert stats["min"] <= stats["median"] <= stats["p99"] <= stats["max"], (name, stats)
        assert row["e2e"]["count"] == 4 and row["ttft"]["count"] == 4 and row["ttfp"]["count"] == 4


def test_text_only_file_dataset_through_the_cli(toy_server: ServerProcess, tmp_path: Path, capsys) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text('{"prompt": "first question"}\n\nplain line question\n')
    path = tmp_path / "serve.json"
    code = cli_main(["bench", "serve", "--base-url", toy_server.url, "--api-key", API_KEY, "--num-prompts", "3",
                     "--max-concurrency", "2", "--dataset", str(dataset), "--text-only", "--warmup", "0",
                     "--json", str(path)])
    assert code == 0, capsys.readouterr()
    row = json.loads(path.read_text())["rows"][0]
    assert row["completed"] == 3 and row["ttfp"] is None and row["rtf"] is None and row["e2e"]["count"] == 3
    assert load_prompts(str(dataset), 3, 0) == ["first question", "plain line question", "first question"]


def test_wrong_api_key_counts_failures(toy_server: ServerProcess, tmp_path: Path, capsys) -> None:
    code = main(["--base-url", toy_server.url, "--api-key", "wrong", "--model", "toy", "--num-prompts", "2",
                 "--max-concurrency", "1", "--warmup", "0"])
    printed = capsys.readouterr().out
    assert code == 1 and "2 of 2 requests failed" in printed and "HTTP 401" in printed


def test_bad_arguments_are_usage_errors() -> None:
    for argv in (["--max-concurrency", "0"], ["--max-concurrency", "a,b"], ["--num-prompts", "0"],
                 ["--dataset", "/no/such/file"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
    assert len(load_prompts("random", 7, 1)) == 7 and load_prompts("random", 5, 3) == load_prompts("random", 5, 3)


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
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0 and all(g >= 0 for g in gaps) and abs(sum(gaps) / len(gaps) - 0.25) < 0.03
    bursty_times = arrival_times(2000, 4.0, 0.2, 7)
    bursty = [b - a for a, b in zip(bursty_times, bursty_times[1:])]

    def spread(values: list[float]) -> float:  # coefficient of variation
        m = sum(values) / len(values)
        return (sum((v - m) ** 2 for v in values) / len(values)) ** 0.5 / m

    assert abs(sum(bursty) / len(bursty) - 0.25) < 0.05 and spread(bursty) > 1.5 * spread(gaps)  # same rate, burstier
    assert parse_goodput(["ttft:500", "rtf:1"]) == {"ttft": 500.0, "rtf": 1.0}
    for bad in (["speed:1"], ["ttft:fast"], ["ttft:0"]):
        with pytest.raises(ValueError, match="--goodput"):
            parse_goodput(bad)

"""``omnipipe bench relay`` runs end to end at tiny sizes: every path's row, the mooncake/raw ratio, the JSON."""

from __future__ import annotations

import importlib.util
import json

import pytest

from omnipipe.bench.relay import BACKEND_PATHS, main, paths_for
from omnipipe.cli.main import build_parser

HAVE_MOONCAKE = importlib.util.find_spec("mooncake") is not None


@pytest.mark.slow
def test_tiny_run_prints_each_path_and_the_ratio(tmp_path, capsys) -> None:
    backends = ["mooncake", "shm", "inline"] if HAVE_MOONCAKE else ["shm", "inline"]
    path = tmp_path / "relay.json"
    assert main(["--backend", *backends, "--sizes", "64KiB", "128KiB", "--iterations", "3", "2",
                 "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "Relay throughput" in printed
    data = json.loads(path.read_text())["relay"]
    expected = set(paths_for(backends))
    assert {r["backend"] for r in data["rows"]} == expected
    assert {(r["size_bytes"], r["iterations"]) for r in data["rows"]} == {(64 << 10, 3), (128 << 10, 2)}
    assert all(r["gbps"] > 0 and len(r["samples_ms"]) == r["iterations"] for r in data["rows"])
    if HAVE_MOONCAKE:
        assert "mooncake raw" in printed and "relay / raw %" in printed
        assert [c["size_bytes"] for c in data["mooncake_vs_raw"]] == [64 << 10, 128 << 10]
        assert all(c["pct_of_raw"] > 0 for c in data["mooncake_vs_raw"])
        assert set(BACKEND_PATHS["mooncake"]) <= expected


def test_the_cli_offers_bench_relay() -> None:
    args = build_parser().parse_args(["bench", "relay", "--backend", "shm"])
    assert args.suite == "relay" and args.rest == ["--backend", "shm"]

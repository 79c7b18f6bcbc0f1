"""``omnipipe bench placement`` at a tiny size (the toy pipeline), so the benchmark cannot rot."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.slow  # a two-node Ray cluster on loopback

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
pytest.importorskip("ray", reason="bench placement needs the ray package (pip install -e '.[ray]')")


def test_one_host_and_two_nodes_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    from omnipipe.bench.placement import main

    assert main(["--pipeline", "toy", "--num-prompts", "2", "--concurrency", "1", "--max-tokens", "8"]) == 0
    printed = capsys.readouterr().out
    assert "| one host " in printed and "| two Ray nodes (mooncake between them) " in printed
    assert "TTFP two nodes / one host at concurrency 1: " in printed

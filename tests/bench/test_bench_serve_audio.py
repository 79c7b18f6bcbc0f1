"""``omnipipe bench serve`` on the endpoints that take speech, against a live server of the default pipeline (the
toy pipeline takes no audio): spoken questions to chat, to ``/v1/audio/transcriptions`` (with the word error rate
of the transcripts) and to ``/v1/realtime``. Numbers come back; no timing thresholds."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from omnipipe.bench.serve import main
from tests.server.conftest import API_KEY, DEFAULT_DEPLOY, ServerProcess, running_server

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_server("default", DEFAULT_DEPLOY, tmp_path_factory.mktemp("bench-default-server"), 600) as server:
        yield server


@pytest.fixture(scope="module")
def spoken_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spoken")


def run(server: ServerProcess, cache: Path, tmp_path: Path, *extra: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One run of two spoken questions at concurrency 2; its row (--json) and its vLLM result (--save-result)."""
    path = tmp_path / "serve.json"
    code = main(["--base-url", server.url, "--api-key", API_KEY, "--num-prompts", "2", "--max-concurrency", "2",
                 "--warmup", "0", "--disable-tqdm", "--max-tokens", "16", "--spoken-cache-dir", str(cache),
                 "--json", str(path), "--save-result", "--save-detailed", "--result-dir", str(tmp_path / "results"),
                 "--result-filename", "run.json", *extra])
    row = json.loads(path.read_text())["rows"][0]
    assert code == 0, row["errors"]
    return row, json.loads((tmp_path / "results" / "run.json").read_text())


def counted(row: dict[str, Any], *metrics: str) -> bool:
    return all(row[m] is not None and row[m]["count"] >= 1 and math.isfinite(row[m]["mean"]) and row[m]["mean"] > 0
               for m in metrics)


def test_transcriptions_of_the_spoken_questions(server: ServerProcess, spoken_cache: Path, tmp_path: Path) -> None:
    row, result = run(server, spoken_cache, tmp_path, "--endpoint", "/v1/audio/transcriptions")
    assert row["completed"] == 2 and counted(row, "ttft", "e2el") and row["tpot"] is None
    # the server's own voice, transcribed by whisper tiny.en: the questions' words come back
    assert row["wer_mean"] is not None and row["wer_mean"] <= 0.3, result["generated_texts"]
    assert result["backend"] == "openai-audio" and result["omnipipe"]["mean_wer"] == pytest.approx(row["wer_mean"])
    assert result["rtfx"] > 0 and all(text.strip() for text in result["generated_texts"])
    assert {"mean_ttft_ms", "p99_itl_ms", "median_e2el_ms"} <= set(result)


def test_realtime_spoken_turns(server: ServerProcess, spoken_cache: Path, tmp_path: Path) -> None:
    row, result = run(server, spoken_cache, tmp_path, "--endpoint", "/v1/realtime", "--percentile-metrics",
                      "ttft,ttfp,e2el,rtf")
    assert row["completed"] == 2 and counted(row, "ttft", "ttfp", "e2el", "rtf")
    assert row["ttfp"]["max"] <= row["e2el"]["max"] and row["audio_s_mean"] > 0
    assert result["backend"] == "omnipipe-realtime" and result["total_output_tokens"] > 0
    assert {"mean_ttfp_ms", "p99_rtf", "std_e2el_ms"} <= set(result) and result["rtfx"] > 0


def test_chat_with_spoken_questions(server: ServerProcess, spoken_cache: Path, tmp_path: Path) -> None:
    row, result = run(server, spoken_cache, tmp_path, "--dataset", "spoken")
    assert row["completed"] == 2 and counted(row, "ttft", "tpot", "ttfp", "rtf", "e2el")
    assert result["backend"] == "openai-chat" and all(text.strip() for text in result["generated_texts"])
    assert result["total_input_tokens"] > 0 and result["rtfx"] > 0

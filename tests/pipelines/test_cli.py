"""The omnipipe command as a user runs it: real subprocesses, real models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from omnipipe.models.default.modeling.whisper import WhisperASR
from omnipipe.util.audio import load_audio, word_error_rate

CLI = [sys.executable, "-m", "omnipipe.cli.main"]


def run(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.models
def test_generate_prints_text_writes_speech_and_stats(tmp_path: Path) -> None:
    out = tmp_path / "answer.wav"
    result = run("generate", "What is the capital of France?", "--output", str(out), "--stats", "--max-tokens", "32")
    assert result.returncode == 0, result.stderr
    text = result.stdout.split("\nrequest\n")[0].strip()
    assert text
    for label in ("TTFT", "TTFP", "RTF", "E2E", "thinker", "talker", "code2wav"):
        assert label in result.stdout
    audio, rate = load_audio(out)
    assert rate == 22050 and len(audio) > rate // 4
    assert word_error_rate(text, WhisperASR().transcribe(audio, rate)) <= 0.25


@pytest.mark.models
def test_models_lists_the_pipelines() -> None:
    result = run("models")
    assert result.returncode == 0
    for name in ("default", "tts", "asr"):
        assert name in result.stdout


@pytest.mark.parametrize("args, message", [
    (["generate", "hi", "--pipeline", "nope"], "unknown pipeline 'nope'"),
    (["generate", "--audio-in", "/no/such.wav"], "--audio-in: file not found"),
    (["generate", "hi", "--deploy", "/no/such.yaml"], "--deploy: file not found"),
    (["generate"], "give a question as text, or --audio-in FILE"),
    (["generate", "hi", "--output", "/no/such/dir/a.wav", "--pipeline", "toy"], "--output: directory does not exist"),
    (["generate", "hi", "--max-tokens", "0", "--pipeline", "toy"], "sampling_params.max_tokens"),
])
def test_user_mistakes_get_one_line_and_exit_2(args, message) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_deploy_yaml_and_corrupt_audio(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: {thinker: {max_num_seqs: 0}}")
    result = run("generate", "hi", "--pipeline", "toy", "--deploy", str(bad))
    assert result.returncode == 2 and "stages.thinker.max_num_seqs" in result.stderr and str(bad) in result.stderr
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    result = run("generate", "--audio-in", str(corrupt))
    assert result.returncode == 2 and "Traceback" not in result.stderr and "corrupt.wav" in result.stderr

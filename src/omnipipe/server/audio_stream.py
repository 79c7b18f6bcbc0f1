"""Audio as the API sends it: streamed PCM16 (resampled without seams), streaming WAV, and whole-file encodings.

OpenAI's headerless ``pcm``/``pcm16`` is 24 kHz mono int16 little-endian; omnipipe pipelines produce other rates
(22,050 Hz for the default voice, 8 kHz for the toy vocoder), so streamed PCM goes through one stateful resampler
per response. WAV streams carry their native rate in a header whose lengths say "unknown".
"""

from __future__ import annotations

import io
import struct

import numpy as np

from omnipipe.protocol.audio import PCM16_MEDIA_TYPE, PCM16_RATE_HZ
from omnipipe.util.audio import encode_audio, resample, to_int16

OPUS_RATE_HZ = 24_000
_UNKNOWN_LENGTH = 0xFFFFFFFF

MEDIA_TYPES: dict[str, str] = {
    "wav": "audio/wav",
    "pcm": PCM16_MEDIA_TYPE,
    "pcm16": PCM16_MEDIA_TYPE,
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
}


class Pcm16Stream:
    """Float chunks at ``from_hz`` -> little-endian int16 bytes at ``to_hz``, continuous across chunks."""

    def __init__(self, from_hz: int, to_hz: int = PCM16_RATE_HZ) -> None:
        self.from_hz = from_hz
        self.to_hz = to_hz
        self._resampler = None
        if from_hz != to_hz:
            import soxr

            self._resampler = soxr.ResampleStream(from_hz, to_hz, 1, dtype="float32", quality="HQ")

    def feed(self, chunk: np.ndarray) -> bytes:
        audio = np.ascontiguousarray(np.asarray(chunk, dtype=np.float32).reshape(-1))
        if self._resampler is not None:
            audio = self._resampler.resample_chunk(audio, last=False)
        return to_int16(audio).astype("<i2").tobytes()

    def flush(self) -> bytes:
        if self._resampler is None:
            return b""
        tail = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        return to_int16(tail).astype("<i2").tobytes()


def streaming_wav_header(sample_rate_hz: int, channels: int = 1, bits: int = 16) -> bytes:
    """A RIFF/WAVE header for PCM data of unknown length (both sizes 0xFFFFFFFF, as streaming servers send)."""
    block_align = channels * bits // 8
    return (b"RIFF" + struct.pack("<I", _UNKNOWN_LENGTH) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate_hz, sample_rate_hz * block_align,
                                    block_align, bits)
            + b"data" + struct.pack("<I", _UNKNOWN_LENGTH))


def encode_whole(audio: np.ndarray, sample_rate_hz: int, fmt: str) -> bytes:
    """The whole answer as one file: ``wav``/``flac``/``mp3`` at the native rate, ``pcm``/``pcm16`` and ``opus``
    at 24 kHz."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if fmt in ("pcm", "pcm16"):
        return encode_audio(resample(audio, sample_rate_hz, PCM16_RATE_HZ), PCM16_RATE_HZ, "pcm16")
    if fmt == "opus":
        import soundfile

        buffer = io.BytesIO()
        samples = np.clip(resample(audio, sample_rate_hz, OPUS_RATE_HZ), -1.0, 1.0)
        soundfile.write(buffer, samples, OPUS_RATE_HZ, format="OGG", subtype="OPUS")
        return buffer.getvalue()
    if fmt in ("wav", "flac", "mp3"):
        return encode_audio(audio, sample_rate_hz, fmt)  # type: ignore[arg-type]
    raise ValueError(f"format: unknown audio format {fmt!r}")

"""Audio as the API sends it: streamed PCM16 (resampled without seams), streaming WAV, compressed formats encoded
as the audio arrives (``EncodedStream``: mp3, opus, aac, flac through PyAV), and whole-file encodings.

OpenAI's headerless ``pcm``/``pcm16`` is 24 kHz mono int16 little-endian; omnipipe pipelines produce other rates
(22,050 Hz for the default voice, 8 kHz for the toy vocoder), so streamed PCM goes through one stateful resampler
per response. WAV streams carry their native rate in a header whose lengths say "unknown". Compressed streams are
written for a reader that cannot seek: no trailing length fix-ups (mp3 has no Xing frame, flac's STREAMINFO keeps
zero length), which decoders read as "length unknown".
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
    "aac": "audio/aac",
}

# format -> (container, codec); the codec's rate: the native one when the codec takes it, else 24 kHz
_ENCODERS: dict[str, tuple[str, str]] = {
    "mp3": ("mp3", "libmp3lame"),
    "opus": ("ogg", "libopus"),
    "aac": ("adts", "aac"),
    "flac": ("flac", "flac"),
}
_MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
_CONTAINER_OPTIONS = {
    "flush_packets": "1",  # hand each packet to the response at once rather than when a 32 KiB buffer fills
    "page_duration": "100000",  # ogg: a page per 0.1 s, not per second
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

    def resample_float(self, chunk: np.ndarray) -> np.ndarray:
        audio = np.ascontiguousarray(np.asarray(chunk, dtype=np.float32).reshape(-1))
        if self._resampler is not None:
            audio = self._resampler.resample_chunk(audio, last=False)
        return audio

    def flush_float(self) -> np.ndarray:
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        return self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)

    def feed(self, chunk: np.ndarray) -> bytes:
        return to_int16(self.resample_float(chunk)).astype("<i2").tobytes()

    def flush(self) -> bytes:
        tail = self.flush_float()
        return to_int16(tail).astype("<i2").tobytes() if tail.size else b""


class _Sink:
    """The writable, unseekable file PyAV muxes into: it keeps what was written until taken."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


class EncodedStream:
    """Float chunks at ``from_hz`` -> bytes of an ``mp3``/``opus``/``aac``/``flac`` stream, encoded as they arrive.

    ``feed`` returns what the encoder has finished so far (possibly nothing: encoders hold a frame or two);
    ``flush`` drains the encoder and closes the stream.
    """

    def __init__(self, fmt: str, from_hz: int) -> None:
        import av

        if fmt not in _ENCODERS:
            raise ValueError(f"format: no streaming encoder for {fmt!r}")
        container_format, codec = _ENCODERS[fmt]
        rate = from_hz
        if fmt == "opus" or (fmt == "mp3" and from_hz not in _MP3_RATES):
            rate = OPUS_RATE_HZ
        self.from_hz, self.rate_hz = from_hz, rate
        self._resampler = Pcm16Stream(from_hz, rate) if rate != from_hz else None
        self._sink = _Sink()
        options = {k: v for k, v in _CONTAINER_OPTIONS.items() if k != "page_duration" or container_format == "ogg"}
        self._container = av.open(self._sink, mode="w", format=container_format, options=options, buffer_size=4096)
        self._stream = self._container.add_stream(codec, rate=rate, layout="mono")
        self._closed = False

    def _encode(self, frame: object) -> bytes:
        for packet in self._stream.encode(frame):  # type: ignore[attr-defined]
            self._container.mux(packet)
        return self._sink.take()

    def feed(self, chunk: np.ndarray) -> bytes:
        audio = np.asarray(chunk, dtype=np.float32).reshape(-1)
        if self._resampler is not None:
            audio = self._resampler.resample_float(audio)
        return self._feed_at_rate(audio)

    def _feed_at_rate(self, audio: np.ndarray) -> bytes:
        import av

        if not audio.size:
            return self._sink.take()
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(np.clip(audio, -1.0, 1.0))[None, :], format="flt",
                                           layout="mono")
        frame.sample_rate = self.rate_hz
        return self._encode(frame)

    def flush(self) -> bytes:
        data = b""
        if self._resampler is not None:
            data += self._feed_at_rate(self._resampler.flush_float())
        data += self._encode(None)
        self.close()
        return data + self._sink.take()

    def close(self) -> None:
        """Release the encoder (also when the response stops early)."""
        if not self._closed:
            self._closed = True
            self._container.close()


def streaming_wav_header(sample_rate_hz: int, channels: int = 1, bits: int = 16) -> bytes:
    """A RIFF/WAVE header for PCM data of unknown length (both sizes 0xFFFFFFFF, as streaming servers send)."""
    block_align = channels * bits // 8
    return (b"RIFF" + struct.pack("<I", _UNKNOWN_LENGTH) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate_hz, sample_rate_hz * block_align,
                                    block_align, bits)
            + b"data" + struct.pack("<I", _UNKNOWN_LENGTH))


def encode_whole(audio: np.ndarray, sample_rate_hz: int, fmt: str) -> bytes:
    """The whole answer as one file: ``wav``/``flac``/``mp3``/``aac`` at the native rate, ``pcm``/``pcm16`` and
    ``opus`` at 24 kHz."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if fmt == "aac":
        stream = EncodedStream("aac", sample_rate_hz)
        return stream.feed(audio) + stream.flush()
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

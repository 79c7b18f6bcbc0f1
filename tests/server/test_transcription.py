"""``/v1/audio/transcriptions`` on the default family's ``asr`` pipeline, through the official ``openai`` client:
every response format, word timestamps, streaming, refused fields, the audio length limit, and a client that
leaves a stream mid-way.

The speech is made in this process by the packaged Piper voice (two sentences with a pause between them, so the
transcript has more than one segment).
"""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile
from openai.types.audio import TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent, TranscriptionVerbose

from omnipipe.util.audio import word_error_rate
from tests.server.conftest import API_KEY, ServerProcess, engines_idle, running_server

pytestmark = pytest.mark.models

SENTENCES = ("The quick brown fox jumps over the lazy dog.", "She sells sea shells by the sea shore.")
SPOKEN = " ".join(SENTENCES)
PAUSE_S = 2.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    # room for the 100 s clip as WAV
    with running_server("asr", None, Path(tmp_path_factory.mktemp("asr-server")), 600,
                        max_body_bytes=8_000_000) as server:
        yield server


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def voice() -> tuple[list[np.ndarray], int]:
    """Each sentence read by the packaged voice (deterministic: no noise)."""
    from omnipipe.models.default.modeling.piper_decoder import PiperDecoder
    from omnipipe.models.default.modeling.piper_talker import PiperTalker
    from omnipipe.models.default.weights.voice import prepare_voice

    paths = prepare_voice(progress=False)
    talker, decoder = PiperTalker(paths), PiperDecoder(paths)
    spoken = [decoder.decode(talker.synthesize_latents(s, noise_scale=0.0, noise_w=0.0)) for s in SENTENCES]
    return spoken, paths.sample_rate_hz


def wav(samples: np.ndarray, rate: int, fmt: str = "WAV") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=fmt, subtype="PCM_16")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def speech(voice: tuple[list[np.ndarray], int]) -> bytes:
    """Both sentences with a pause between them, as a WAV file."""
    spoken, rate = voice
    pause = np.zeros(int(PAUSE_S * rate), np.float32)
    return wav(np.concatenate([spoken[0], pause, spoken[1]]), rate)


@pytest.fixture(scope="module")
def long_speech(voice: tuple[list[np.ndarray], int]) -> bytes:
    """About 100 s of the sentences again and again (four of whisper's 30 s windows)."""
    spoken, rate = voice
    pause = np.zeros(int(0.5 * rate), np.float32)
    pieces, total = [], 0
    while total < 100 * rate:
        for sentence in spoken:
            pieces += [sentence, pause]
            total += sentence.size + pause.size
    return wav(np.concatenate(pieces), rate)


def transcribe(client: openai.OpenAI, audio: bytes, **kwargs):  # noqa: ANN201 - the client's own types
    return client.audio.transcriptions.create(model="asr", file=("speech.wav", audio, "audio/wav"), **kwargs)


def test_json(client: openai.OpenAI, speech: bytes) -> None:
    result = transcribe(client, speech)
    assert word_error_rate(SPOKEN, result.text) <= 0.25, result.text
    assert result.usage is not None and result.usage.type == "duration" and result.usage.seconds > 4


def test_text(client: openai.OpenAI, speech: bytes) -> None:
    text = transcribe(client, speech, response_format="text")
    assert isinstance(text, str) and word_error_rate(SPOKEN, text) <= 0.25, text


def test_verbose_json_with_segments_and_words(client: openai.OpenAI, server: ServerProcess, speech: bytes) -> None:
    with server.client() as http:
        response = http.post("/v1/audio/transcriptions", files={"file": ("s.wav", speech, "audio/wav")},
                             data={"model": "asr", "response_format": "verbose_json",
                                   "timestamp_granularities[]": ["word", "segment"]})
    assert response.status_code == 200, response.text
    verbose = TranscriptionVerbose.model_validate(response.json(), strict=True)
    assert verbose.language == "english" and 6.0 < verbose.duration < 10.0
    assert word_error_rate(SPOKEN, verbose.text) <= 0.25, verbose.text
    segments = verbose.segments or []
    assert len(segments) >= 2, segments
    assert [s.id for s in segments] == list(range(len(segments)))
    assert " ".join(s.text.strip() for s in segments) == verbose.text
    for segment in segments:
        assert 0 <= segment.start < segment.end <= verbose.duration + 0.05
        assert segment.tokens and segment.avg_logprob < 0 and segment.compression_ratio > 0
        assert 0 <= segment.no_speech_prob <= 1 and segment.temperature == 0
    assert all(a.end <= b.start + 0.01 for a, b in zip(segments, segments[1:], strict=False))
    # the pause: the second sentence starts after the first one's speech and the silence
    first_len_s = segments[0].end
    assert segments[-1].start >= first_len_s
    words = verbose.words or []
    assert word_error_rate(SPOKEN, " ".join(w.word for w in words)) <= 0.25
    assert all(0 <= w.start <= w.end <= verbose.duration + 0.05 for w in words)
    assert all(a.start <= b.start for a, b in zip(words, words[1:], strict=False))
    fox = next(w for w in words if w.word.strip(".,").lower() == "fox")
    shells = next(w for w in words if "shell" in w.word.lower())
    assert fox.end < segments[0].end + 0.01 and shells.start > segments[0].end

    # the same through the client (segments without words unless asked for)
    typed = transcribe(client, speech, response_format="verbose_json")
    assert isinstance(typed, TranscriptionVerbose) and typed.words is None
    assert [s.text for s in typed.segments or []] == [s.text for s in segments]
    worded = transcribe(client, speech, response_format="verbose_json", timestamp_granularities=["word"])
    assert [w.word for w in worded.words or []] == [w.word for w in words]


SRT_CUE = re.compile(r"(\d+)\n(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})\n(.+)\n")
VTT_CUE = re.compile(r"(\d\d):(\d\d):(\d\d)\.(\d{3}) --> (\d\d):(\d\d):(\d\d)\.(\d{3})\n(.+)\n")


def _seconds(parts: tuple[str, ...]) -> float:
    hours, minutes, seconds, millis = (int(p) for p in parts)
    return hours * 3600 + minutes * 60 + seconds + millis / 1000


def test_srt_and_vtt(client: openai.OpenAI, server: ServerProcess, speech: bytes) -> None:
    verbose = transcribe(client, speech, response_format="verbose_json")
    segments = verbose.segments or []
    srt = transcribe(client, speech, response_format="srt")
    cues = SRT_CUE.findall(srt)
    assert len(cues) == len(segments) and srt.endswith("\n"), srt
    for number, (cue, segment) in enumerate(zip(cues, segments, strict=True), start=1):
        assert int(cue[0]) == number and cue[9] == segment.text.strip()
        assert abs(_seconds(cue[1:5]) - segment.start) < 0.002 and abs(_seconds(cue[5:9]) - segment.end) < 0.002
    assert srt.count("\n\n") == len(segments) - 1  # cues apart by one blank line
    vtt = transcribe(client, speech, response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n")
    vcues = VTT_CUE.findall(vtt)
    assert [c[8] for c in vcues] == [s.text.strip() for s in segments]
    assert all(abs(_seconds(c[0:4]) - s.start) < 0.002 for c, s in zip(vcues, segments, strict=True))
    with server.client() as http:
        for fmt in ("srt", "vtt", "text"):
            response = http.post("/v1/audio/transcriptions", files={"file": ("s.wav", speech, "audio/wav")},
                                 data={"model": "asr", "response_format": fmt})
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")


def test_stream(client: openai.OpenAI, speech: bytes) -> None:
    events = list(transcribe(client, speech, stream=True))
    deltas = [e for e in events if isinstance(e, TranscriptionTextDeltaEvent)]
    done = events[-1]
    assert isinstance(done, TranscriptionTextDoneEvent) and len(deltas) >= 2
    assert all(isinstance(e, TranscriptionTextDeltaEvent) for e in events[:-1])
    assert "".join(d.delta for d in deltas) == done.text
    assert word_error_rate(SPOKEN, done.text) <= 0.25, done.text
    assert done.usage is not None and done.usage.output_tokens > 5
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
    assert done.text == transcribe(client, speech).text
    text_stream = list(transcribe(client, speech, stream=True, response_format="text"))
    assert text_stream[-1].text == done.text


@pytest.mark.parametrize("fields,param", [
    ({"response_format": "xml"}, "response_format"),
    ({"stream": "true", "response_format": "verbose_json"}, "response_format"),
    ({"stream": "true", "response_format": "srt"}, "response_format"),
    ({"timestamp_granularities[]": "word"}, "timestamp_granularities"),
    ({"timestamp_granularities[]": "sentence", "response_format": "verbose_json"}, "timestamp_granularities[]"),
    ({"timestamp_granularities": "word", "response_format": "verbose_json"}, "timestamp_granularities"),
    ({"chunking_strategy": "auto"}, "chunking_strategy"),
    ({"include[]": "logprobs"}, "include"),
    ({"known_speaker_names[]": "ann"}, "known_speaker_names"),
    ({"no_such_field": "1"}, "no_such_field"),
    ({"temperature": "1.5"}, "temperature"),
    ({"language": "fr"}, "language"),
    ({"prompt": "x" * 5000}, "prompt"),
])
def test_refused_fields(server: ServerProcess, speech: bytes, fields: dict[str, str], param: str) -> None:
    with server.client() as http:
        response = http.post("/v1/audio/transcriptions", files={"file": ("s.wav", speech, "audio/wav")},
                             data={"model": "asr", **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].startswith(param) and param.removesuffix("[]") in error["message"], error


def test_refused_fields_through_the_client(client: openai.OpenAI, speech: bytes) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        transcribe(client, speech, include=["logprobs"])
    assert caught.value.param == "include"
    with pytest.raises(openai.BadRequestError) as caught:
        transcribe(client, speech, chunking_strategy="auto")
    assert caught.value.param == "chunking_strategy"
    with pytest.raises(openai.BadRequestError) as caught:
        transcribe(client, speech, response_format="srt", stream=True)
    assert caught.value.param == "response_format"


def test_prompt_and_temperature_reach_the_decoder(client: openai.OpenAI, speech: bytes) -> None:
    prompted = transcribe(client, speech, prompt="Sea shells, seashore.", temperature=0.0,
                          response_format="verbose_json")
    assert word_error_rate(SPOKEN, prompted.text) <= 0.25, prompted.text
    sampled = transcribe(client, speech, temperature=0.5, response_format="verbose_json")
    assert all(s.temperature == 0.5 for s in sampled.segments or []) and sampled.segments


def test_audio_over_the_length_limit_is_refused(server: ServerProcess) -> None:
    rate = 16_000
    tone = (0.1 * np.sin(np.arange(121 * rate) * 2 * np.pi * 220 / rate)).astype(np.float32)
    with server.client() as http:
        for fmt in ("json", "verbose_json"):
            response = http.post("/v1/audio/transcriptions", data={"model": "asr", "response_format": fmt},
                                 files={"file": ("long.flac", wav(tone, rate, "FLAC"), "audio/flac")})
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "file" and "120" in error["message"], error


def test_leaving_a_stream_stops_the_decoding(client: openai.OpenAI, server: ServerProcess,
                                             long_speech: bytes) -> None:
    started = time.perf_counter()
    whole = transcribe(client, long_speech, response_format="verbose_json")
    whole_s = time.perf_counter() - started
    assert whole.duration > 95 and len(whole.segments or []) > 8
    with (httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as http,
          http.stream("POST", "/v1/audio/transcriptions", files={"file": ("l.wav", long_speech, "audio/wav")},
                      data={"model": "asr", "stream": "true"}) as response):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert "transcript.text.delta" in first
        left = time.perf_counter()
    # the request is aborted in the stage between two segments: gone long before a whole decode would end
    assert engines_idle(server.wait_idle(timeout_s=whole_s))
    assert time.perf_counter() - left < 0.6 * whole_s, (time.perf_counter() - left, whole_s)

"""``/v1/audio/speech`` as OpenAI clients use it, against a server whose main pipeline is the real ``tts`` pipeline
(Piper talker -> decoder): every format through the official client, decoded with PyAV; mp3 (the default) arriving
while the speech is still being made; the voices endpoint, OpenAI voice names and the voice object; ``speed``
proportional to the duration; ``instructions`` refused."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from tests.server.conftest import API_KEY, DEFAULT_DEPLOY, ServerProcess, decode_audio, running_server

pytestmark = pytest.mark.models

SENTENCE = "The quick brown fox jumps over the lazy dog."
# long enough that synthesis takes seconds: a streaming format must start well before it ends
LONG_TEXT = " ".join([
    "It was a bright cold day in April, and the clocks were striking thirteen.",
    "Winston Smith, his chin nuzzled into his breast in an effort to escape the vile wind, slipped quickly through "
    "the glass doors of Victory Mansions, though not quickly enough to prevent a swirl of gritty dust from entering "
    "along with him.",
    "The hallway smelt of boiled cabbage and old rag mats.",
    "At one end of it a coloured poster, too large for indoor display, had been tacked to the wall.",
] * 2)
PCM_RATE_HZ = 24_000


@pytest.fixture(scope="module")
def tts_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server("tts", DEFAULT_DEPLOY, tmp_path_factory.mktemp("tts-server"), 600) as server:
        yield server


@pytest.fixture(scope="module")
def client(tts_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tts_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


def pcm_seconds(client: openai.OpenAI, text: str, **kwargs: object) -> float:
    response = client.audio.speech.create(model="tts", input=text, voice="default", response_format="pcm",
                                          **kwargs)  # type: ignore[arg-type]
    return len(response.content) / 2 / PCM_RATE_HZ


def timed_stream(client: openai.OpenAI, text: str, fmt: str | None) -> tuple[list[tuple[float, bytes]], float, str]:
    """The pieces of a streamed answer with their arrival times (s after the request), when it ended, its type."""
    kwargs = {} if fmt is None else {"response_format": fmt}
    pieces: list[tuple[float, bytes]] = []
    started = time.perf_counter()
    with client.audio.speech.with_streaming_response.create(model="tts", input=text, voice="alloy",
                                                            **kwargs) as response:  # type: ignore[arg-type]
        media_type = response.headers["content-type"]
        for piece in response.iter_bytes():
            if piece:
                pieces.append((time.perf_counter() - started, piece))
    return pieces, time.perf_counter() - started, media_type


@pytest.mark.parametrize("fmt,media_type", [("mp3", "audio/mpeg"), ("opus", "audio/ogg"), ("aac", "audio/aac"),
                                            ("flac", "audio/flac"), ("wav", "audio/wav"), (None, "audio/mpeg")])
def test_every_format_streams_audio_of_the_right_length(client: openai.OpenAI, fmt: str | None,
                                                        media_type: str) -> None:
    reference = pcm_seconds(client, SENTENCE)
    assert 1.0 < reference < 6.0
    pieces, _, got_type = timed_stream(client, SENTENCE, fmt)
    assert got_type == media_type
    samples, rate = decode_audio(b"".join(p for _, p in pieces))
    assert rate > 0
    # encoders pad a frame or so at each end
    assert abs(len(samples) / rate - reference) < 0.15 * reference, (fmt, len(samples) / rate, reference)
    assert np.abs(samples).max() > 0.05  # speech, not silence


def test_mp3_decodes_while_it_arrives(client: openai.OpenAI) -> None:
    pieces, total_s, _ = timed_stream(client, LONG_TEXT, None)  # the default format, mp3
    wav_pieces, wav_total_s, _ = timed_stream(client, LONG_TEXT, "wav")
    first_s, wav_first_s = pieces[0][0], wav_pieces[0][0]
    print(f"first byte: mp3 {first_s:.2f} s of {total_s:.2f} s; wav {wav_first_s:.2f} s of {wav_total_s:.2f} s")
    assert len(pieces) > 3
    assert first_s < 0.5 * total_s
    # what has arrived a little after the first piece already decodes to speech, long before the end
    early = b"".join(p for t, p in pieces if t <= first_s + 0.25 * (total_s - first_s))
    whole = b"".join(p for _, p in pieces)
    assert len(early) < len(whole)
    early_samples, rate = decode_audio(early)
    whole_samples, _ = decode_audio(whole)
    assert 0 < len(early_samples) < len(whole_samples)
    assert np.abs(early_samples).max() > 0.05
    assert len(whole_samples) / rate > 10.0


def test_voices_endpoint(tts_server: ServerProcess) -> None:
    with tts_server.client() as http:
        listed = http.get("/v1/audio/voices").json()
        one = http.get("/v1/audio/voices", params={"model": "tts"}).json()
        missing = http.get("/v1/audio/voices", params={"model": "nobody"})
    ids = [v["id"] for v in listed["voices"]]
    assert ids == ["default", "joe"] and all(v["name"] == v["id"] for v in listed["voices"])
    assert listed["models"] == {"tts": listed["voices"]}
    assert one["model"] == "tts" and one["voices"] == listed["voices"]
    assert "alloy" in listed["voices"][0]["aliases"] and "cedar" in listed["voices"][0]["aliases"]
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"


@pytest.mark.parametrize("voice", ["alloy", "marin", "joe", {"id": "joe"}, {"id": "nova"}])
def test_openai_voice_names_and_voice_objects(client: openai.OpenAI, voice: object) -> None:
    response = client.audio.speech.create(model="tts", input="Hello there.", voice=voice,  # type: ignore[arg-type]
                                          response_format="pcm")
    assert len(response.content) > 0.3 * 2 * PCM_RATE_HZ


@pytest.mark.parametrize("voice", ["nobody", {"id": "nobody"}])
def test_unknown_voice_is_a_400_naming_voice(client: openai.OpenAI, voice: object) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.audio.speech.create(model="tts", input="Hello.", voice=voice)  # type: ignore[arg-type]
    error = raised.value.body
    assert isinstance(error, dict) and error["param"] == "voice"
    assert "joe" in error["message"] and "alloy" in error["message"]


def test_speed_is_proportional(client: openai.OpenAI) -> None:
    normal = pcm_seconds(client, SENTENCE)
    fast = pcm_seconds(client, SENTENCE, speed=2.0)
    slow = pcm_seconds(client, SENTENCE, speed=0.5)
    print(f"speed 2: {fast / normal:.3f} of the duration; speed 0.5: {slow / normal:.3f}")
    assert abs(fast / normal - 0.5) <= 0.05
    assert abs(slow / normal - 2.0) <= 0.2


def test_instructions_are_refused(client: openai.OpenAI, tts_server: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.audio.speech.create(model="tts", input="Hello.", voice="alloy", instructions="Speak cheerfully.")
    error = raised.value.body
    assert isinstance(error, dict) and error["param"] == "instructions"
    with tts_server.client() as http:  # an empty instruction asks for nothing
        response = http.post("/v1/audio/speech", json={"model": "tts", "input": "Hi.", "instructions": ""})
    assert response.status_code == 200


def test_bad_speed_and_format_are_400s(tts_server: ServerProcess) -> None:
    with httpx.Client(base_url=tts_server.url, headers=tts_server.headers, timeout=60) as http:
        for body, param in (({"speed": 5}, "speed"), ({"response_format": "ogg"}, "response_format")):
            response = http.post("/v1/audio/speech", json={"model": "tts", "input": "Hi.", **body})
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == param

"""The real default family behind the server, through the official ``openai`` client.

Speech is judged the way a listener would: transcribed by the packaged whisper model and compared with the text it
should say (word error rate after normalising case and punctuation).
"""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
import soundfile

from omnipipe.models.default.modeling.whisper import WhisperASR
from omnipipe.util.audio import load_audio, word_error_rate
from tests.server.conftest import API_KEY, ServerProcess, engines_idle

pytestmark = pytest.mark.models

QUESTION = "What is the capital of France?"
SENTENCE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def asr() -> WhisperASR:
    return WhisperASR(num_threads=2)


@pytest.fixture(scope="module")
def client(default_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{default_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def spoken_sentence(client: openai.OpenAI) -> bytes:
    """SENTENCE read aloud by the speech endpoint, streamed as WAV."""
    with client.audio.speech.with_streaming_response.create(model="tts", input=SENTENCE, voice="default",
                                                            response_format="wav") as response:
        return b"".join(response.iter_bytes())


def streamed_wav_samples(data: bytes) -> tuple[np.ndarray, int]:
    """A streaming WAV (lengths unknown): the rate from the header, int16 samples after it."""
    assert data[:4] == b"RIFF" and data[36:40] == b"data"
    rate = int.from_bytes(data[24:28], "little")
    return np.frombuffer(data[44:], dtype="<i2").astype(np.float32) / 32768.0, rate


def test_models_list(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["default", "tts", "asr"]


def test_chat_text_only(client: openai.OpenAI, default_server: ServerProcess) -> None:
    completion = client.chat.completions.create(model="default", messages=[{"role": "user", "content": QUESTION}],
                                                max_tokens=40, temperature=0)
    message = completion.choices[0].message
    assert message.content and message.content.strip()
    assert message.audio is None
    assert completion.usage.completion_tokens > 0
    # text only: the talker and the vocoder were never involved
    assert engines_idle(default_server.wait_idle())


def test_chat_text_and_audio_non_streaming(client: openai.OpenAI, asr: WhisperASR) -> None:
    completion = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": QUESTION}], modalities=["text", "audio"],
        audio={"voice": "default", "format": "wav"}, max_tokens=40)
    message = completion.choices[0].message
    assert message.content is None and message.audio is not None and message.audio.transcript.strip()
    audio, rate = soundfile.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="float32")
    assert rate == 22050 and len(audio) > 0.3 * rate
    heard = asr.transcribe(audio, rate)
    assert word_error_rate(message.audio.transcript, heard) <= 0.25, (message.audio.transcript, heard)


def test_chat_streaming_audio_deltas(client: openai.OpenAI, asr: WhisperASR, default_server: ServerProcess) -> None:
    stream = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": QUESTION}], modalities=["text", "audio"],
        audio={"voice": "joe", "format": "pcm16"}, stream=True, stream_options={"include_usage": True},
        max_tokens=40)
    text, transcript, pcm, finish, usage = "", "", b"", None, None
    for chunk in stream:
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        if delta.audio:
            audio = delta.audio if isinstance(delta.audio, dict) else delta.audio.model_dump()
            transcript += audio.get("transcript") or ""
            pcm += base64.b64decode(audio["data"]) if audio.get("data") else b""
        finish = chunk.choices[0].finish_reason or finish
    assert not text and transcript.strip()  # the words once, as the audio's transcript
    assert finish in ("stop", "length") and usage is not None
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    assert len(samples) > 0.3 * 24000
    heard = asr.transcribe(samples, 24000)
    assert word_error_rate(transcript, heard) <= 0.25, (transcript, heard)
    assert engines_idle(default_server.wait_idle())


def test_speech_streaming(spoken_sentence: bytes, asr: WhisperASR) -> None:
    samples, rate = streamed_wav_samples(spoken_sentence)
    assert rate == 22050 and len(samples) > 1.0 * rate
    assert word_error_rate(SENTENCE, asr.transcribe(samples, rate)) <= 0.25


def test_speech_pcm_is_24khz(client: openai.OpenAI, asr: WhisperASR) -> None:
    response = client.audio.speech.create(model="default", input=SENTENCE, voice="joe", response_format="pcm",
                                          speed=1.25)
    samples = np.frombuffer(response.content, dtype="<i2").astype(np.float32) / 32768.0
    assert len(samples) > 1.0 * 24000
    assert word_error_rate(SENTENCE, asr.transcribe(samples, 24000)) <= 0.25


def test_transcription_of_speech_the_server_made(client: openai.OpenAI, spoken_sentence: bytes) -> None:
    samples, rate = streamed_wav_samples(spoken_sentence)
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    result = client.audio.transcriptions.create(model="asr", file=("sentence.wav", buffer.getvalue(), "audio/wav"))
    assert word_error_rate(SENTENCE, result.text) <= 0.25, result.text
    verbose = client.audio.transcriptions.create(model="default", file=("s.wav", buffer.getvalue(), "audio/wav"),
                                                 response_format="verbose_json")
    assert verbose.text == result.text and verbose.duration > 1.0
    plain = client.audio.transcriptions.create(model="asr", file=("s.wav", buffer.getvalue(), "audio/wav"),
                                               response_format="text")
    assert plain.strip() == result.text


def test_spoken_question_in_chat(client: openai.OpenAI, spoken_sentence: bytes) -> None:
    samples, rate = streamed_wav_samples(spoken_sentence)
    audio, _ = load_audio(samples, source_rate_hz=rate)
    buffer = io.BytesIO()
    soundfile.write(buffer, audio, rate, format="FLAC")
    completion = client.chat.completions.create(
        model="default", max_tokens=30, messages=[{"role": "user", "content": [
            {"type": "text", "text": "Answer briefly."},
            {"type": "input_audio", "input_audio": {"data": base64.b64encode(buffer.getvalue()).decode(),
                                                    "format": "flac"}}]}])
    assert completion.choices[0].message.content.strip()


@pytest.mark.parametrize("path,kwargs,param", [
    ("/v1/chat/completions", {"json": {"model": "default", "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"not audio at all" * 8).decode(),
                                                "format": "wav"}}]}]}}, "messages[0].content[0].input_audio.data"),
    ("/v1/audio/transcriptions", {"data": {"model": "asr"}, "files": {"file": ("x.wav", b"garbage" * 20, "audio/wav")}},
     "file"),
    ("/v1/audio/speech", {"json": {"model": "tts", "input": "hi", "voice": "nobody"}}, "voice"),
    ("/v1/chat/completions", {"json": {"model": "default", "messages": [{"role": "user", "content": "hi"}],
                                       "modalities": ["text", "audio"], "audio": {"voice": "nobody"}}},
     "audio.voice"),
])
def test_audio_input_errors(default_server: ServerProcess, path: str, kwargs: dict, param: str) -> None:
    with httpx.Client(base_url=default_server.url, headers=default_server.headers, timeout=120) as http:
        response = http.post(path, **kwargs)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert engines_idle(default_server.wait_idle())


def test_realtime_spoken_turn_is_transcribed_beside_the_answer(default_server: ServerProcess,
                                                               spoken_sentence: bytes) -> None:
    import json

    import soxr
    from websockets.sync.client import connect

    samples, rate = streamed_wav_samples(spoken_sentence)
    pcm = (np.clip(soxr.resample(samples, rate, 24_000), -1, 1) * 32767).astype("<i2").tobytes()
    url = default_server.url.replace("http://", "ws://") + "/v1/realtime"
    with connect(url, additional_headers=default_server.headers, max_size=None, open_timeout=60) as ws:
        def send(type_: str, **fields: object) -> None:
            ws.send(json.dumps({"type": type_, **fields}))

        send("session.update", session={"type": "realtime", "output_modalities": ["text"], "audio": {
            "input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}}})
        send("input_audio_buffer.append", audio=base64.b64encode(pcm).decode())
        send("input_audio_buffer.commit")
        send("response.create")
        events: dict[str, dict] = {}
        while not {"response.done", "conversation.item.input_audio_transcription.completed"} <= set(events):
            event = json.loads(ws.recv(timeout=300))
            assert event["type"] != "error", event
            events.setdefault(event["type"], event)
    assert events["session.updated"]["session"]["audio"]["input"]["transcription"]["model"] == "whisper-1"
    transcribed = events["conversation.item.input_audio_transcription.completed"]
    assert transcribed["item_id"] == events["input_audio_buffer.committed"]["item_id"]
    assert word_error_rate(SENTENCE, transcribed["transcript"]) <= 0.25, transcribed["transcript"]
    assert events["response.done"]["response"]["status"] == "completed"


# ---------------------------------------------------------------------------------------------- conversations
def test_a_fact_from_two_turns_back_is_used(client: openai.OpenAI) -> None:
    """The conversation reaches the thinker: a fact the user gave in turn 1 answers the question in turn 3, after an
    unrelated turn 2. (``omnipipe bench quality`` checks recall for each thinker.)"""
    messages: list[dict] = [{"role": "system", "content": "You are a friendly assistant."}]
    for text in ("My favourite animal is the axolotl.", "What is the capital of France?"):
        messages.append({"role": "user", "content": text})
        answer = client.chat.completions.create(model="default", messages=messages, max_tokens=30, temperature=0)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    messages.append({"role": "user", "content": "What is my favourite animal?"})
    completion = client.chat.completions.create(model="default", messages=messages, max_tokens=30, temperature=0)
    assert "axolotl" in completion.choices[0].message.content.lower(), messages + [completion.choices[0].message]
    alone = client.chat.completions.create(model="default", max_tokens=30, temperature=0,
                                           messages=[{"role": "user", "content": "What is my favourite animal?"}])
    assert "axolotl" not in alone.choices[0].message.content.lower()  # it came from the conversation
    assert completion.usage.prompt_tokens > alone.usage.prompt_tokens > 0


HOTEL = ("You are the booking assistant of the Grand Hotel in Lisbon. " + " ".join(
    f"Room {number} is on floor {number // 100}, sleeps {2 + number % 3} and costs {90 + number % 7 * 10} euros a "
    "night." for number in range(101, 131)) + " Answer in one short sentence.")


def _prefix_hits(server: ServerProcess) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=server.headers, timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("omnipipe:prefix_cache_hits_total{"))


def test_a_conversations_turns_and_another_with_its_system_prompt_are_prefilled_from_the_prefix_cache(
        client: openai.OpenAI, default_server: ServerProcess) -> None:
    """A long system prompt over three turns: from turn 2 on, everything before the new question comes from the
    cache (``usage.prompt_tokens_details.cached_tokens``); a second conversation with the same system prompt finds
    it too; /metrics counts the hits."""
    hits_before = _prefix_hits(default_server)
    messages: list[dict] = [{"role": "system", "content": HOTEL}]
    usages = []
    for question in ("How much is room 105?", "And room 117?", "Which floor is it on?"):
        messages.append({"role": "user", "content": question})
        answer = client.chat.completions.create(model="default", messages=messages, max_tokens=16, temperature=0)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
        usages.append(answer.usage)
    other = client.chat.completions.create(model="default", max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": HOTEL}, {"role": "user", "content": "Does room 120 sleep three?"}]).usage
    first, second, third = usages
    assert first.prompt_tokens > 600
    assert first.prompt_tokens_details.cached_tokens < 60  # the shared preamble only
    # shared in whole KV blocks of 16 tokens: all of turn 1's blocks at least
    assert second.prompt_tokens_details.cached_tokens >= first.prompt_tokens // 16 * 16
    assert third.prompt_tokens_details.cached_tokens >= second.prompt_tokens // 16 * 16
    assert other.prompt_tokens_details.cached_tokens > first.prompt_tokens - 20 - 16  # all but the new question
    cached = sum(u.prompt_tokens_details.cached_tokens for u in (*usages, other))
    assert _prefix_hits(default_server) - hits_before == cached


def test_an_earlier_spoken_answer_is_referred_to_by_its_audio_id(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model="default", modalities=["text", "audio"], audio={"voice": "default", "format": "wav"}, max_tokens=30,
        temperature=0, messages=[{"role": "user", "content": "My favourite animal is the axolotl."}])
    spoken = first.choices[0].message
    assert spoken.content is None and spoken.audio is not None and spoken.audio.transcript.strip()
    messages = [{"role": "user", "content": "My favourite animal is the axolotl."},
                {"role": "assistant", "audio": {"id": spoken.audio.id}},
                {"role": "user", "content": "What is my favourite animal?"}]
    completion = client.chat.completions.create(model="default", messages=messages, max_tokens=30, temperature=0)
    assert "axolotl" in completion.choices[0].message.content.lower(), completion.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="default", max_tokens=5, messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "audio": {"id": "audio_unknown"}},
            {"role": "user", "content": "and?"}])
    assert refused.value.body["param"] == "messages[1].audio.id", refused.value.body


def test_a_realtime_session_keeps_the_conversation(default_server: ServerProcess) -> None:
    """Text turns over one realtime session: the third answer uses the first turn's fact; a new session has no
    memory of it."""
    import json

    from websockets.sync.client import connect

    url = default_server.url.replace("http://", "ws://") + "/v1/realtime"

    usages: list[dict] = []

    def turn(ws, text: str) -> str:  # type: ignore[no-untyped-def]
        ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
        ws.send(json.dumps({"type": "response.create"}))
        while True:
            event = json.loads(ws.recv(timeout=300))
            assert event["type"] != "error", event
            if event["type"] == "response.done":
                assert event["response"]["status"] == "completed", event
                usages.append(event["response"]["usage"])
                return event["response"]["output"][0]["content"][0]["text"]

    def conversation(*texts: str) -> list[str]:
        with connect(url, additional_headers=default_server.headers, max_size=None, open_timeout=60) as ws:
            ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "audio": {"input": {"turn_detection": None}}, "output_modalities": ["text"],
                "instructions": "You are a friendly assistant."}}))
            return [turn(ws, text) for text in texts]

    answers = conversation("My favourite animal is the axolotl.", "What is the capital of France?",
                           "What is my favourite animal?")
    assert "axolotl" in answers[2].lower(), answers  # turn 3 uses turn 1
    # each later turn went on from the one before it in the thinker's prefix cache
    for before, after in zip(usages[:2], usages[1:3], strict=True):
        assert after["input_token_details"]["cached_tokens"] >= before["input_tokens"] // 16 * 16, usages  # blocks
    assert "axolotl" not in conversation("What is my favourite animal?")[0].lower()

"""The OpenAI protocol against a live server running the fast deterministic ``toy`` pipeline.

The toy thinker answers with the question upper-cased; its vocoder produces 8 kHz audio.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import API_KEY, ServerProcess, decode_audio

TOY_RATE_HZ = 8000


@pytest.fixture(scope="module")
def client(toy_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{toy_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def sse_events(response: httpx.Response) -> list[Any]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_health_models_openapi(toy_server: ServerProcess, client: openai.OpenAI) -> None:
    health = httpx.get(f"{toy_server.url}/health").json()
    assert {k: health[k] for k in ("status", "pipeline", "capacity")} == {"status": "ready", "pipeline": "toy",
                                                                          "capacity": None}
    assert health["state"] in ("IDLE", "BUSY")
    ids = [m.id for m in client.models.list().data]
    assert ids == ["toy", "toy_tts"]
    spec = httpx.get(f"{toy_server.url}/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/audio/speech", "/v1/audio/transcriptions", "/v1/models"} <= set(spec["paths"])


def test_chat_text_only(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "hello there"}], max_tokens=100, temperature=0)
    choice = completion.choices[0]
    assert choice.message.content == "HELLO THERE"
    assert choice.message.audio is None
    assert choice.finish_reason == "stop"
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    assert completion.usage.prompt_tokens == len("hello there") + 1  # the toy tokenizer: a token a character, EOS
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_chat_text_parts_and_max_tokens(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="toy", max_completion_tokens=4,
        messages=[{"role": "user", "content": [{"type": "text", "text": "abc"}, {"type": "text", "text": "def"}]}])
    assert completion.choices[0].message.content == "ABC "
    assert completion.choices[0].finish_reason == "length"


def test_chat_shapes_validate_against_the_openai_types(toy_server: ServerProcess) -> None:
    """The bodies parse as the openai package's own types, field for field (a drift in shape fails here)."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    base = {"model": "toy", "messages": [{"role": "user", "content": "shape"}], "max_tokens": 20}
    with toy_server.client() as http:
        for extra in ({}, {"modalities": ["text", "audio"], "audio": {"voice": "default", "format": "wav"}}):
            body = http.post("/v1/chat/completions", json={**base, **extra}).json()
            parsed = ChatCompletion.model_validate(body)
            assert set(body) <= set(ChatCompletion.model_fields), body
            assert set(body["choices"][0]["message"]) <= set(type(parsed.choices[0].message).model_fields)
        stream = {**base, "stream": True, "stream_options": {"include_usage": True},
                  "modalities": ["text", "audio"], "audio": {"voice": "default", "format": "pcm16"}}
        with http.stream("POST", "/v1/chat/completions", json=stream) as response:
            chunks = sse_events(response)[:-1]
    for chunk in chunks:
        parsed = ChatCompletionChunk.model_validate(chunk)
        assert set(chunk) <= set(ChatCompletionChunk.model_fields), chunk
        for choice in chunk["choices"]:
            assert "content" not in choice["delta"] or choice["delta"]["content"] is None, chunk
    assert chunks[-1]["usage"]["prompt_tokens"] == len("shape") + 1 and parsed.usage is not None


def test_the_toy_family_refuses_a_conversation(client: openai.OpenAI) -> None:
    """It answers one question at a time: earlier turns and system messages are a 400, never dropped."""
    for messages in ([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                     [{"role": "user", "content": "a"}, {"role": "assistant", "content": "A"},
                      {"role": "user", "content": "b"}]):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="toy", messages=messages, max_tokens=5)
        assert refused.value.body["param"] == "messages" and "one question" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="toy", max_tokens=5, messages=[
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "A"}])
    assert refused.value.body["param"] == "messages[1].role"


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"frobnicate": 1}, "frobnicate"),
])
def test_unsupported_parameters_are_refused_by_name(client: openai.OpenAI, fields: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       extra_body=fields)
    body = refused.value.body
    assert body["param"] == param and body["code"] == "unsupported_parameter" and param in body["message"], body


def test_off_values_and_bookkeeping_fields_are_accepted(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "fine"}], max_tokens=10, logprobs=False, tools=[],
        tool_choice="none", response_format={"type": "text"}, user="someone", store=False, metadata={"k": "v"},
        parallel_tool_calls=False, extra_body={"top_k": 5, "repetition_penalty": 1.1})
    assert completion.choices[0].message.content == "FINE"


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "pcm16", "aac"])
def test_chat_audio_non_streaming(client: openai.OpenAI, fmt: str) -> None:
    completion = client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "say hi"}], modalities=["text", "audio"],
        audio={"voice": "default", "format": fmt}, max_tokens=100)
    message = completion.choices[0].message
    assert message.content is None  # as OpenAI: a spoken answer's words are its transcript, not also content
    assert message.audio is not None and message.audio.transcript == "SAY HI"
    assert message.audio.id and message.audio.expires_at > 0
    data = base64.b64decode(message.audio.data)
    if fmt == "pcm16":
        audio = np.frombuffer(data, dtype="<i2")
        rate = 24000
    elif fmt == "aac":
        audio, rate = decode_audio(data)
    else:
        audio, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    assert rate == {"wav": TOY_RATE_HZ, "flac": TOY_RATE_HZ, "mp3": TOY_RATE_HZ, "opus": 24000, "pcm16": 24000,
                    "aac": TOY_RATE_HZ}[fmt]
    assert len(audio) > 0.05 * rate and np.abs(audio).max() > 0


def test_chat_streaming_with_audio_deltas(client: openai.OpenAI, toy_server: ServerProcess) -> None:
    stream = client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "stream me please"}], modalities=["text", "audio"],
        audio={"voice": "default", "format": "pcm16"}, stream=True, stream_options={"include_usage": True},
        max_tokens=100)
    text, transcript, pcm, finish, usage, audio_ids = "", "", b"", None, None, set()
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        audio = getattr(delta, "audio", None)
        if audio:
            audio = audio if isinstance(audio, dict) else audio.model_dump()
            audio_ids.add(audio["id"])
            transcript += audio.get("transcript") or ""
            if audio.get("data"):
                pcm += base64.b64decode(audio["data"])
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert text == "" and transcript == "STREAM ME PLEASE"  # the words once, as the audio's transcript
    assert finish == "stop" and usage is not None and usage.completion_tokens > 0
    assert len(audio_ids) == 1
    # the whole answer's audio, resampled to 24 kHz as one stream, equals the non-streamed pcm16
    whole = client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "stream me please"}], modalities=["text", "audio"],
        audio={"voice": "default", "format": "pcm16"}, max_tokens=100)
    expected = np.frombuffer(base64.b64decode(whole.choices[0].message.audio.data), dtype="<i2")
    got = np.frombuffer(pcm, dtype="<i2")
    assert abs(len(got) - len(expected)) <= 2
    n = min(len(got), len(expected))
    assert np.abs(got[:n].astype(np.int32) - expected[:n]).max() <= 200  # resampling seams only
    assert toy_server.wait_idle()["engines"]


def test_chat_streaming_raw_sse_format(toy_server: ServerProcess) -> None:
    body = {"model": "toy", "messages": [{"role": "user", "content": "ab"}], "stream": True}
    with toy_server.client() as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "AB"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_omnipipe_extension_fields(toy_server: ServerProcess) -> None:
    body = {"model": "toy", "messages": [{"role": "user", "content": "abcdef"}], "modalities": ["text", "audio"],
            "omnipipe": {"sampling_params": {"thinker": {"max_tokens": 3}}, "initial_codec_chunk_frames": 2}}
    with toy_server.client() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["audio"]["transcript"] == "ABC"


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac", "mp3", "opus", "aac", None])
def test_speech_streams_audio(toy_server: ServerProcess, fmt: str | None) -> None:
    body = {"model": "toy", "input": "read this aloud", "voice": "default"}
    if fmt is not None:
        body["response_format"] = fmt
    with toy_server.client() as http, http.stream("POST", "/v1/audio/speech", json=body) as response:
        assert response.status_code == 200
        data = b"".join(response.iter_raw())
    if fmt is None:  # the default, as OpenAI's
        assert response.headers["content-type"] == "audio/mpeg"
    if fmt == "pcm":
        assert response.headers["content-type"] == "audio/pcm"
        audio = np.frombuffer(data, dtype="<i2")
        assert len(audio) > 0.1 * 24000
        return
    if fmt == "wav":
        assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
        assert int.from_bytes(data[40:44], "little") == 0xFFFFFFFF  # streaming: length unknown
        audio = np.frombuffer(data[44:], dtype="<i2")
        assert int.from_bytes(data[24:28], "little") == TOY_RATE_HZ
        assert len(audio) > 0.1 * TOY_RATE_HZ
        return
    audio, rate = decode_audio(data)
    assert rate > 0 and len(audio) > 0.1 * rate


def test_speech_voice_names_objects_and_instructions(client: openai.OpenAI, toy_server: ServerProcess) -> None:
    for voice in ("alloy", "verse", {"id": "default"}, {"id": "shimmer"}):
        response = client.audio.speech.create(model="toy_tts", input="hi", voice=voice,  # type: ignore[arg-type]
                                              response_format="pcm")
        assert len(response.content) > 0
    with pytest.raises(openai.BadRequestError) as raised:
        client.audio.speech.create(model="toy_tts", input="hi", voice="alloy", instructions="whisper")
    assert raised.value.body["param"] == "instructions"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as raised:
        client.audio.speech.create(model="toy_tts", input="hi", voice={"id": "nobody"})  # type: ignore[arg-type]
    assert raised.value.body["param"] == "voice" and "alloy" in raised.value.body["message"]  # type: ignore[index]
    voices = httpx.get(f"{toy_server.url}/v1/audio/voices", headers=toy_server.headers).json()
    assert [v["id"] for v in voices["voices"]] == ["default"] and set(voices["models"]) == {"toy", "toy_tts"}
    completion = client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "say hi"}], modalities=["text", "audio"],
        audio={"voice": {"id": "alloy"}, "format": "wav"}, max_tokens=100)  # type: ignore[typeddict-item]
    assert completion.choices[0].message.audio is not None
    samples, rate = decode_audio(base64.b64decode(completion.choices[0].message.audio.data))
    assert rate == TOY_RATE_HZ and len(samples) > 0.05 * rate
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "hi"}],
                                       modalities=["text", "audio"], audio={"voice": {"id": "x"}, "format": "wav"})
    assert raised.value.body["param"] == "audio.voice"  # type: ignore[index]


def test_speech_with_openai_client_and_speed(client: openai.OpenAI) -> None:
    normal = client.audio.speech.create(model="toy_tts", input="hello world", voice="default", response_format="pcm")
    fast = client.audio.speech.create(model="toy", input="hello world", voice="default", response_format="pcm",
                                      speed=2.0)
    assert len(normal.content) > 0 and len(fast.content) > 0
    assert abs(len(fast.content) / len(normal.content) - 0.5) <= 0.05


def test_speech_sse(toy_server: ServerProcess) -> None:
    body = {"model": "toy", "input": "hi", "response_format": "pcm", "stream_format": "sse"}
    with toy_server.client() as http, http.stream("POST", "/v1/audio/speech", json=body) as response:
        assert response.status_code == 200
        events = sse_events(response)
    assert events[-1]["type"] == "speech.audio.done"
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert deltas and sum(len(base64.b64decode(e["audio"])) for e in deltas) > 0


def test_transcription_not_available_on_toy(toy_server: ServerProcess) -> None:
    with toy_server.client() as http:
        response = http.post("/v1/audio/transcriptions", data={"model": "toy"},
                             files={"file": ("a.wav", b"RIFF", "audio/wav")})
    assert response.status_code == 404 and response.json()["error"]["code"] == "endpoint_not_available"


def test_metrics_and_debug_state(toy_server: ServerProcess) -> None:
    with toy_server.client() as http:
        http.post("/v1/chat/completions", json={"model": "toy", "messages": [{"role": "user", "content": "xyz"}],
                                                "modalities": ["text", "audio"],
                                                "audio": {"voice": "default", "format": "wav"}})
        text = http.get("/metrics").text
        state = http.get("/debug/state").json()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    requests = [s for s in families["omnipipe:http_requests"].samples
                if s.labels == {"model_name": "toy", "endpoint": "/v1/chat/completions", "status": "200"}]
    assert requests and requests[0].value >= 1
    # vLLM's names with our prefix, labelled by model: a vLLM dashboard query finds TTFT, running and waiting
    for name in ("omnipipe:time_to_first_token_seconds", "omnipipe:e2e_request_latency_seconds",
                 "omnipipe:time_per_output_token_seconds", "omnipipe:inter_token_latency_seconds",
                 "omnipipe:time_to_first_packet_seconds", "omnipipe:real_time_factor"):
        assert families[name].type == "histogram"
        counts = [s for s in families[name].samples if s.name == f"{name}_count" and s.labels["model_name"] == "toy"]
        assert counts and counts[0].value >= 1, name
    for name in ("omnipipe:num_requests_running", "omnipipe:num_requests_waiting"):
        assert [s for s in families[name].samples if s.labels == {"model_name": "toy", "pipeline": "toy"}], name
    tokens = [s for s in families["omnipipe:generation_tokens"].samples if s.name.endswith("_total")
              and s.labels.get("endpoint") == "/v1/chat/completions"]  # the shared server's other endpoints beside
    assert tokens and tokens[0].value >= 1
    assert [s for s in families["omnipipe:stage_requests"].samples
            if s.labels == {"model_name": "toy", "pipeline": "toy", "stage": "thinker"}]
    assert families["process_resident_memory_bytes"].samples[0].value > 0  # the process itself
    assert state["engines"]["toy"]["status"] == "ready"
    assert set(state["engines"]["toy"]["state"]["stages"]) == {"thinker", "talker", "code2wav"}

"""Voxtral through a real ``omnipipe serve --pipeline voxtral --model DIR`` process, the real ``openai`` client and a
websocket client, on a tiny checkpoint written by ``omnipipe tiny-checkpoint voxtral``. Every answer and transcript
is the model's own ``generate`` output for the prompt the request makes:

- a chat completion with an ``input_audio`` part; ``/v1/audio/transcriptions`` (the ``voxtral_transcribe`` engine,
  started on first use), whole and streamed (a delta per token; the usage counts the audio at Voxtral's 12.5 tokens
  a second), in the language the request names (``lang:xx`` in the prompt) or the one the model hears;
- a ``/v1/realtime`` session: a spoken turn answered in text, its transcript from ``voxtral_transcribe``, then a
  typed turn answered with both in its history;
- ``/v1/models`` lists both pipelines with their modalities;
- what Voxtral lacks is refused by name: an image part, audio output (chat ``modalities``, the realtime
  ``output_modalities``), ``/v1/audio/speech`` (``model``), a language it was not released for (``language``)."""

from __future__ import annotations

import base64
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch

from tests.models import media_files
from tests.server.conftest import API_KEY, ServerProcess, running_server, spoken
from tests.server.test_realtime import RATE, of, pcm16_b64, session, silence

pytestmark = pytest.mark.slow  # a server process with a stage process, and a second engine for transcriptions

ANSWER_TOKENS = 12
CLIP_S = 4


def _reference(checkpoint: Path, item: dict[str, Any]) -> str:
    """The model's own greedy answer for ``item``'s prompt, decoded as the stage decodes it."""
    from transformers import VoxtralForConditionalGeneration

    from omnipipe.models.voxtral.prompting import VoxtralPrompts
    from omnipipe.models.voxtral.weights.load import load_config

    prompts = VoxtralPrompts(checkpoint, load_config(checkpoint))
    inputs = prompts(item)
    model = VoxtralForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True).eval()
    ids = inputs["input_ids"]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, input_features=inputs.get("input_features"),
                             attention_mask=torch.ones_like(ids), max_new_tokens=ANSWER_TOKENS, do_sample=False)
    return str(prompts.tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True))


def _prompt_tokens(checkpoint: Path, item: dict[str, Any]) -> int:
    from omnipipe.models.voxtral.prompting import VoxtralPrompts
    from omnipipe.models.voxtral.weights.load import load_config

    return int(VoxtralPrompts(checkpoint, load_config(checkpoint))(item)["input_ids"].shape[1])


def _transcribed_prompt_tokens(server: ServerProcess) -> float:
    """The prompt tokens of every transcription the server has made (its Prometheus counter)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.url}/metrics", headers=server.headers, timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "omnipipe:prefix_cache_queries_total"
               and sample.labels.get("endpoint") == "/v1/audio/transcriptions")


def _transcription(samples: np.ndarray, language: str | None = None) -> dict[str, Any]:
    from omnipipe.models.voxtral.prompting import TRANSCRIBE_TASK

    return {"audios": [samples], "task": TRANSCRIBE_TASK, **({"language": language} if language else {})}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("voxtral-server") / "ckpt"
    subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "tiny-checkpoint", "voxtral", str(directory)],
                   check=True, capture_output=True, timeout=300, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    return directory


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    deploy = {"stages": {"thinker": {"threads": 1, "options": {"max_new_tokens": ANSWER_TOKENS}}}}
    with running_server("voxtral", deploy, tmp_path_factory.mktemp("voxtral-serve"), 300,
                        extra_args=("--model", str(checkpoint))) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=240)


@pytest.fixture(scope="module")
def wav() -> bytes:
    t = np.arange(16000 * CLIP_S) / 16000
    return media_files.wav((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))


@pytest.fixture(scope="module")
def samples(wav: bytes) -> np.ndarray:
    from omnipipe.util.media import load_audio

    return load_audio(wav, "audio")


def test_chat_with_audio_and_a_transcription_through_the_openai_server(checkpoint: Path, client: openai.OpenAI,
                                                                       wav: bytes, samples: np.ndarray) -> None:
    question = "what do you hear?"
    audio_part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
    reply = client.chat.completions.create(model="voxtral", temperature=0, messages=[
        {"role": "user", "content": [audio_part, {"type": "text", "text": question}]}])
    assert reply.choices[0].message.content == _reference(checkpoint, {"text": question, "audios": [samples]})
    assert reply.choices[0].finish_reason == "length"  # the tiny model never writes its end token
    transcript = client.audio.transcriptions.create(model="voxtral", file=("clip.wav", wav))
    assert transcript.text == _reference(checkpoint, _transcription(samples)).strip()


def test_a_streamed_transcription_sends_each_token_and_counts_the_audio_at_voxtrals_rate(
        checkpoint: Path, client: openai.OpenAI, wav: bytes, samples: np.ndarray) -> None:
    want = _reference(checkpoint, _transcription(samples))
    deltas: list[str] = []
    done = None
    for event in client.audio.transcriptions.create(model="voxtral", file=("clip.wav", wav), stream=True):
        if event.type == "transcript.text.delta":
            deltas.append(event.delta)
        else:
            assert event.type == "transcript.text.done", event
            done = event
    assert "".join(deltas) == want and len(deltas) > 1  # as Voxtral decodes it, not in one piece
    assert done is not None and done.text == want.strip()
    usage = done.usage
    assert usage is not None and usage.type == "tokens"
    audio_tokens = math.ceil(CLIP_S * 12.5)  # 375 a 30 s window, not whisper's 1500
    assert usage.input_tokens == audio_tokens and usage.output_tokens == ANSWER_TOKENS
    assert usage.input_token_details is not None and usage.input_token_details.audio_tokens == audio_tokens
    assert usage.total_tokens == audio_tokens + ANSWER_TOKENS


def test_a_transcription_in_the_language_asked_and_one_voxtral_lacks_refused(
        checkpoint: Path, server: ServerProcess, client: openai.OpenAI, wav: bytes, samples: np.ndarray) -> None:
    french = _reference(checkpoint, _transcription(samples, "fr")).strip()
    # the prompt's ``lang:fr`` (the tiny model's answer hardly depends on it: the prompt's length shows it)
    with_language = _prompt_tokens(checkpoint, _transcription(samples, "fr"))
    assert with_language > _prompt_tokens(checkpoint, _transcription(samples))
    for language in ("fr", "French"):
        before = _transcribed_prompt_tokens(server)
        assert client.audio.transcriptions.create(model="voxtral", file=("clip.wav", wav),
                                                  language=language).text == french
        assert _transcribed_prompt_tokens(server) - before == with_language
    verbose = client.audio.transcriptions.create(model="voxtral", file=("clip.wav", wav), language="fr",
                                                 response_format="verbose_json")
    assert verbose.language == "french" and verbose.text == french and abs(verbose.duration - CLIP_S) < 0.01
    for language in ("ja", "klingon"):
        with pytest.raises(openai.BadRequestError) as caught:
            client.audio.transcriptions.create(model="voxtral", file=("clip.wav", wav), language=language)
        assert caught.value.body["param"] == "language"
        assert "en (english), es (spanish), fr (french)" in caught.value.body["message"]
    for knob, value in (("prompt", "Hello"), ("temperature", 0.0)):  # whisper's knobs, which Voxtral's stage lacks
        with pytest.raises(openai.BadRequestError) as caught:
            client.audio.transcriptions.create(model="voxtral", file=("clip.wav", wav), **{knob: value})
        assert caught.value.body["param"] == knob


def test_models_lists_both_pipelines_with_their_modalities(client: openai.OpenAI) -> None:
    cards = {card.id: card.model_dump() for card in client.models.list().data}
    assert set(cards) == {"voxtral", "voxtral_transcribe"}
    assert (cards["voxtral"]["input_modalities"], cards["voxtral"]["output_modalities"]) == (["text", "audio"],
                                                                                            ["text"])
    assert cards["voxtral"]["conversation"] is True
    transcribe = cards["voxtral_transcribe"]
    assert (transcribe["input_modalities"], transcribe["output_modalities"]) == (["audio"], ["text"])


def test_what_voxtral_lacks_is_refused_by_name(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="voxtral", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "text", "text": "what is this?"}]}])
    assert caught.value.body["param"] == "messages[0].content[0].image_url"
    assert "does not take image input" in caught.value.body["message"]
    for modalities in (["audio"], ["text", "audio"]):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="voxtral", modalities=modalities,  # type: ignore[arg-type]
                                           audio={"voice": "alloy", "format": "wav"},
                                           messages=[{"role": "user", "content": "say it"}])
        assert caught.value.body["param"] == "modalities" and "'audio' is not produced" in caught.value.body["message"]
    with pytest.raises(openai.NotFoundError) as missing:
        client.audio.speech.create(model="voxtral", voice="alloy", input="hello")
    assert missing.value.body["param"] == "model" and missing.value.body["code"] == "endpoint_not_available"
    assert "has no pipeline for the speech endpoint" in missing.value.body["message"]


def test_a_realtime_session_answers_a_spoken_turn_in_text_with_voxtrals_transcript(
        checkpoint: Path, server: ServerProcess) -> None:
    from omnipipe.util.media import load_audio

    question = np.concatenate([silence(0.3), spoken("What do you hear in this recording?"), silence(0.3)])
    sent = np.frombuffer(base64.b64decode(pcm16_b64(question)), "<i2").astype(np.float32) / 32768.0
    heard = load_audio((sent, RATE), "audio")  # the clip the server resamples to Voxtral's 16 kHz
    with session(server) as conn:
        updated = conn.no_vad(audio={"input": {"transcription": {"model": "whisper-1", "language": "en"}}})
        assert updated["session"]["output_modalities"] == ["text"]  # Voxtral does not speak
        refused = conn.update(output_modalities=["audio"])
        assert refused["type"] == "error" and refused["error"]["param"] == "session.output_modalities", refused
        conn.send("input_audio_buffer.append", audio=pcm16_b64(question))
        conn.send("input_audio_buffer.commit")
        conn.send("response.create", response={"output_modalities": ["audio"]})
        _, refused = conn.until("error", "response.created")
        assert refused["type"] == "error" and refused["error"]["param"] == "response.output_modalities", refused
        assert refused["error"]["code"] == "unsupported_modality"
        conn.send("response.create")
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", (done, of(events, "error"))
        answer = "".join(event["delta"] for event in of(events, "response.output_text.delta"))
        assert answer == _reference(checkpoint, {"text": "", "audios": [heard]})
        assert not of(events, "response.output_audio.delta")
        transcribed = of(events, "conversation.item.input_audio_transcription.completed")
        if not transcribed:  # the transcription runs beside the answer
            transcribed = [conn.until("conversation.item.input_audio_transcription.completed",
                                      "conversation.item.input_audio_transcription.failed")[1]]
        words = transcribed[0]["transcript"]
        assert words == _reference(checkpoint, _transcription(heard, "en")).strip()  # the session's language
        conn.user_text("and now?")
        conn.send("response.create")
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", (done, of(events, "error"))
        history = [{"role": "user", "content": words}, {"role": "assistant", "content": answer.strip()}]
        again = "".join(event["delta"] for event in of(events, "response.output_text.delta"))
        assert again == _reference(checkpoint, {"text": "and now?", "history": history})
    state = httpx.get(f"{server.url}/debug/state", headers=server.headers, timeout=30).json()
    assert state["engines"]["voxtral_transcribe"]["status"] == "ready"  # the session's transcription engine


def _flac(seconds: float, rate: int = 16000) -> bytes:
    """A quiet tone of ``seconds`` as FLAC: a long clip in few bytes (the test server takes bodies of 2 MB)."""
    import io

    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.01 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="FLAC")
    return buffer.getvalue()


def _chat_refusal(client: openai.OpenAI, data: bytes, fmt: str = "wav") -> dict[str, Any]:
    audio_part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="voxtral", messages=[
            {"role": "user", "content": [audio_part, {"type": "text", "text": "what do you hear?"}]}])
    body = caught.value.body
    assert isinstance(body, dict)
    return body


def test_audio_that_is_not_audio_is_refused_by_name_and_the_server_goes_on(
        checkpoint: Path, client: openai.OpenAI, wav: bytes, samples: np.ndarray) -> None:
    noise, text = np.random.default_rng(0).bytes(4000), b"these are the notes of a meeting, not a recording\n" * 20
    for data in (noise, text, wav[:40]):  # random bytes, a text file, a WAV header with no samples after it
        body = _chat_refusal(client, data)
        assert body["param"] == "messages[0].content[0].input_audio.data", body
        assert "audio" in body["message"], body
    for name, data in (("notes.txt", text), ("clip.wav", noise)):
        with pytest.raises(openai.BadRequestError) as caught:
            client.audio.transcriptions.create(model="voxtral", file=(name, data))
        assert caught.value.body["param"] == "file", caught.value.body  # type: ignore[index]
    question = "what do you hear?"
    audio_part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
    reply = client.chat.completions.create(model="voxtral", temperature=0, messages=[
        {"role": "user", "content": [audio_part, {"type": "text", "text": question}]}])
    assert reply.choices[0].message.content == _reference(checkpoint, {"text": question, "audios": [samples]})


def test_audio_longer_than_voxtral_takes_is_refused_by_name_and_the_server_goes_on(
        checkpoint: Path, client: openai.OpenAI, wav: bytes, samples: np.ndarray) -> None:
    """The tiny checkpoint's context (4096 positions) holds ten 30 s windows of 375 tokens and the answer: a clip of
    eleven windows is refused before its audio is encoded; past the server's 1200 s, any clip is."""
    from omnipipe.util.media import MAX_AUDIO_SECONDS

    long_clip = _flac(10 * 30 + 5)  # 11 windows: 4125 audio tokens
    body = _chat_refusal(client, long_clip, "flac")
    assert body["param"] == "messages[0].content[0].input_audio.data", body
    assert "4096" in body["message"] and "300 s" in body["message"], body
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.transcriptions.create(model="voxtral", file=("long.flac", long_clip))
    assert caught.value.body["param"] == "file", caught.value.body  # type: ignore[index]
    endless = _flac(MAX_AUDIO_SECONDS + 1, rate=4000)
    assert len(endless) < 1_500_000
    body = _chat_refusal(client, endless, "flac")
    assert body["param"] == "messages[0].content[0].input_audio.data", body
    assert f"longer than {MAX_AUDIO_SECONDS:g} s" in body["message"], body
    # ten windows fit
    reply = client.chat.completions.create(model="voxtral", temperature=0, max_tokens=2, messages=[
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {
            "data": base64.b64encode(_flac(10 * 30 - 1)).decode(), "format": "flac"}}]}])
    assert reply.usage is not None and reply.usage.prompt_tokens > 3750
    transcript = client.audio.transcriptions.create(model="voxtral", file=("clip.wav", wav))
    assert transcript.text == _reference(checkpoint, _transcription(samples)).strip()

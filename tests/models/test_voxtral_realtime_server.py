"""Voxtral Realtime through a real ``omnipipe serve --pipeline voxtral_realtime --model DIR`` process and the real
``openai`` client, on a tiny checkpoint written by ``omnipipe tiny-checkpoint voxtral_realtime``: a transcription
(audio in, text out: the pipeline serves ``/v1/audio/transcriptions`` itself), whole and streamed, is the model's
own ``generate`` output for the clip, its usage counting the audio at 12.5 tokens a second."""

from __future__ import annotations

import base64
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import torch

from tests.models import media_files
from tests.server.conftest import API_KEY, ServerProcess, running_server

pytestmark = pytest.mark.slow  # a server process with a stage process

CLIP_S = 3


def _reference(checkpoint: Path, samples: np.ndarray) -> tuple[str, int]:
    """The model's own greedy transcript of ``samples`` (as the stage decodes it) and its token count."""
    from transformers import VoxtralRealtimeForConditionalGeneration

    from omnipipe.models.voxtral_realtime.prompting import RealtimePrompts
    from omnipipe.models.voxtral_realtime.weights.load import load_config

    prompts = RealtimePrompts(checkpoint, load_config(checkpoint))
    inputs = prompts(samples)
    model = VoxtralRealtimeForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True).eval()
    ids = inputs["input_ids"]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, input_features=inputs["input_features"],
                             attention_mask=torch.ones_like(ids), num_delay_tokens=prompts.num_delay_tokens,
                             do_sample=False)
    tokens = out[0, ids.shape[1]:].tolist()
    return str(prompts.tokenizer.decode(tokens, skip_special_tokens=True)), len(tokens)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("voxtral-realtime-server") / "ckpt"
    subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "tiny-checkpoint", "voxtral_realtime", str(directory)],
                   check=True, capture_output=True, timeout=300, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    return directory


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    deploy = {"stages": {"transcriber": {"threads": 1}}}
    with running_server("voxtral_realtime", deploy, tmp_path_factory.mktemp("voxtral-realtime-serve"), 300,
                        extra_args=("--model", str(checkpoint))) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=240)


@pytest.fixture(scope="module")
def wav() -> bytes:
    t = np.arange(16000 * CLIP_S) / 16000
    tone = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return media_files.wav(tone.astype(np.float32))


def test_a_transcription_through_the_openai_server_is_generates(checkpoint: Path, client: openai.OpenAI,
                                                                wav: bytes) -> None:
    from omnipipe.util.media import load_audio

    want, count = _reference(checkpoint, load_audio(wav, "audio"))
    assert count == math.ceil(CLIP_S * 12.5) + 17 - 7  # N - L: 16 + clip + 17 audio tokens, <s> + 16 + 6 prompt
    transcript = client.audio.transcriptions.create(model="voxtral_realtime", file=("clip.wav", wav))
    assert transcript.text == want.strip()
    deltas: list[str] = []
    done = None
    for event in client.audio.transcriptions.create(model="voxtral_realtime", file=("clip.wav", wav), stream=True):
        if event.type == "transcript.text.delta":
            deltas.append(event.delta)
        else:
            assert event.type == "transcript.text.done", event
            done = event
    assert "".join(deltas) == want and len(deltas) > 1  # as it decodes, not in one piece
    assert done is not None and done.text == want.strip()
    usage = done.usage
    assert usage is not None and usage.type == "tokens"
    audio_tokens = math.ceil(CLIP_S * 12.5)
    assert usage.input_tokens == audio_tokens and usage.output_tokens == count


def _flac(seconds: float, rate: int) -> bytes:
    """A quiet tone of ``seconds`` as FLAC: a long clip in few bytes (the test server takes bodies of 2 MB)."""
    import io

    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.01 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="FLAC")
    return buffer.getvalue()


def _bad_files() -> list[tuple[str, bytes, str]]:
    """(name, data, what the refusal says): a text file, random bytes, a clip past the server's 1200 s."""
    from omnipipe.util.media import MAX_AUDIO_SECONDS

    text = b"these are the notes of a meeting, not a recording\n" * 20
    return [("notes.txt", text, "is not audio"), ("clip.wav", np.random.default_rng(1).bytes(3000), "is not audio"),
            ("long.flac", _flac(MAX_AUDIO_SECONDS + 1, 4000), f"longer than {MAX_AUDIO_SECONDS:g} s")]


def test_files_that_are_not_audio_or_too_long_are_refused_and_the_server_goes_on(
        checkpoint: Path, client: openai.OpenAI, wav: bytes) -> None:
    from omnipipe.util.media import load_audio

    for name, data, says in _bad_files():
        with pytest.raises(openai.BadRequestError) as caught:
            client.audio.transcriptions.create(model="voxtral_realtime", file=(name, data))
        assert says in caught.value.body["message"], caught.value.body  # type: ignore[index]
    assert client.audio.transcriptions.create(model="voxtral_realtime", file=("clip.wav", wav)).text == _reference(
        checkpoint, load_audio(wav, "audio"))[0].strip()


def test_a_bad_file_is_refused_naming_file(client: openai.OpenAI) -> None:
    for name, data, _ in _bad_files():
        with pytest.raises(openai.BadRequestError) as caught:
            client.audio.transcriptions.create(model="voxtral_realtime", file=(name, data))
        assert caught.value.body["param"] == "file", caught.value.body  # type: ignore[index]


def test_a_language_it_lacks_and_chat_are_refused_by_name(checkpoint: Path, client: openai.OpenAI,
                                                           wav: bytes) -> None:
    from omnipipe.util.media import load_audio

    want = _reference(checkpoint, load_audio(wav, "audio"))[0].strip()
    for language in ("sw", "klingon"):  # Swahili: not one of the 13 it was released for
        with pytest.raises(openai.BadRequestError) as caught:
            client.audio.transcriptions.create(model="voxtral_realtime", file=("clip.wav", wav), language=language)
        assert caught.value.body["param"] == "language", caught.value.body  # type: ignore[index]
        assert "de (german), ru, zh, ja, it (italian)" in caught.value.body["message"]  # type: ignore[index]
    # one it has: only checked (the model hears it; the prompt names none)
    assert client.audio.transcriptions.create(model="voxtral_realtime", file=("clip.wav", wav),
                                              language="ja").text == want
    # it transcribes, it does not converse: a chat, spoken or typed, is refused naming the model
    audio_part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
    for content in ([audio_part], "what is the capital of France?"):
        with pytest.raises(openai.NotFoundError) as missing:
            client.chat.completions.create(model="voxtral_realtime", messages=[{"role": "user", "content": content}])
        assert missing.value.body["param"] == "model", missing.value.body  # type: ignore[index]
        assert missing.value.body["code"] == "endpoint_not_available"  # type: ignore[index]
        assert "transcri" in missing.value.body["message"]  # type: ignore[index]
    assert client.audio.transcriptions.create(model="voxtral_realtime", file=("clip.wav", wav)).text == want

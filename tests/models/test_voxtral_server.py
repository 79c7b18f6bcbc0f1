"""Voxtral through a real ``omnipipe serve --pipeline voxtral --model DIR`` process and the real ``openai`` client,
on a tiny checkpoint written by ``omnipipe tiny-checkpoint voxtral``: a chat completion with an ``input_audio``
part answers what the model's own ``generate`` answers for that prompt, ``/v1/audio/transcriptions`` gives the
transcription prompt's ``generate`` output (the ``voxtral_transcribe`` engine, started on first use), and a part
of a modality Voxtral does not take is refused naming the part."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch

from tests.models import media_files
from tests.server.conftest import API_KEY, running_server

pytestmark = pytest.mark.slow  # a server process with a stage process, and a second engine for transcriptions

ANSWER_TOKENS = 12


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
        out = model.generate(input_ids=ids, input_features=inputs["input_features"],
                             attention_mask=torch.ones_like(ids), max_new_tokens=ANSWER_TOKENS, do_sample=False)
    return str(prompts.tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True))


def test_chat_with_audio_and_a_transcription_through_the_openai_server(tmp_path: Path) -> None:
    from omnipipe.models.voxtral.prompting import TRANSCRIBE_TASK
    from omnipipe.util.media import load_audio

    checkpoint = tmp_path / "ckpt"
    subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "tiny-checkpoint", "voxtral", str(checkpoint)],
                   check=True, capture_output=True, timeout=300, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    t = np.arange(16000 * 4) / 16000
    wav = media_files.wav((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))
    samples = load_audio(wav, "audio")
    question = "what do you hear?"
    want_answer = _reference(checkpoint, {"text": question, "audios": [samples]})
    want_transcript = _reference(checkpoint, {"audios": [samples], "task": TRANSCRIBE_TASK})
    deploy = {"stages": {"thinker": {"threads": 1, "options": {"max_new_tokens": ANSWER_TOKENS}}}}
    with running_server("voxtral", deploy, tmp_path, 300, extra_args=("--model", str(checkpoint))) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=240)
        audio_part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
        reply = client.chat.completions.create(model="voxtral", temperature=0, messages=[
            {"role": "user", "content": [audio_part, {"type": "text", "text": question}]}])
        assert reply.choices[0].message.content == want_answer
        assert reply.choices[0].finish_reason == "length"  # the tiny model never writes its end token
        transcript = client.audio.transcriptions.create(model="voxtral", file=("clip.wav", wav))
        assert transcript.text == want_transcript.strip()
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="voxtral", messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "text", "text": "what is this?"}]}])
        assert caught.value.body["param"] == "messages[0].content[0].image_url"
        assert "does not take image input" in caught.value.body["message"]

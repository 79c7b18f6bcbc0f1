"""CSM through a real ``omnipipe serve --pipeline csm --model DIR`` process and the real ``openai`` client, on a tiny
checkpoint written by ``omnipipe tiny-checkpoint csm``: ``/v1/audio/speech`` in a speaker id's voice returns a WAV of
the frames the backbone may write (``max_new_tokens``, 1920 samples each at 24 kHz), the voices listed are the speaker
ids, an unknown voice is refused naming ``voice``, and a voice made from an uploaded clip speaks too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.models import media_files
from tests.server.conftest import API_KEY, running_server

pytestmark = pytest.mark.slow  # a server process with two stage processes

FRAMES = 10
WAV_HEADER = 44


def test_speech_in_each_kind_of_voice_through_the_openai_server(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIPIPE_CACHE", str(tmp_path / "cache"))
    checkpoint = tmp_path / "ckpt"
    subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "tiny-checkpoint", "csm", str(checkpoint)],
                   check=True, capture_output=True, timeout=300, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    deploy = {"stages": {"backbone": {"threads": 1, "options": {"max_new_tokens": FRAMES}}, "mimi": {"threads": 1}}}
    with running_server("csm", deploy, tmp_path, 300, extra_args=("--model", str(checkpoint))) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=240)

        def speech(voice: str) -> bytes:
            return client.audio.speech.create(model="csm", voice=voice, input="hello from sesame.",
                                              response_format="wav").content

        said = speech("0")
        assert said[:4] == b"RIFF" and len(said) == WAV_HEADER + FRAMES * 1920 * 2  # int16 at 24 kHz
        assert np.abs(np.frombuffer(said[WAV_HEADER:], np.int16)).max() > 0
        headers = {"Authorization": f"Bearer {API_KEY}"}
        listed = httpx.get(f"{server.url}/v1/audio/voices", params={"model": "csm"}, headers=headers, timeout=30)
        assert [voice["id"] for voice in listed.json()["voices"]] == ["default", *map(str, range(10))]
        with pytest.raises(openai.BadRequestError) as caught:
            speech("nobody")
        assert caught.value.body["param"] == "voice" and "0, 1, 2" in caught.value.body["message"]

        t = np.arange(int(24000 * 1.5)) / 24000
        clip = media_files.wav((0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000)
        made = httpx.post(f"{server.url}/v1/audio/voices", data={"name": "mine", "base_voice": "1"},
                          files={"audio": ("clip.wav", clip)}, headers=headers, timeout=120)
        assert made.status_code == 201 and made.json()["base_voice"] == "1", made.text
        assert len(speech("mine")) == len(said)  # heard first, then the text said in speaker 1's turn

"""The OpenAI server's voices for a checkpoint family, checked with the real client: the checkpoint's voices are
listed, the one asked for is the one spoken (any case; OpenAI's names and ``default`` are the stage's own), an unknown
one or one at odds with the talker's ``extra.speaker`` is refused naming ``audio.voice``."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY


def speak(client: openai.OpenAI, model: str, voice: str, sampling: dict[str, Any]) -> bytes:
    """A spoken answer's WAV bytes (greedy and seeded through ``sampling``, so the same voice says it the same)."""
    reply = client.chat.completions.create(
        model=model, modalities=["text", "audio"], audio={"voice": voice, "format": "wav"}, max_tokens=6,
        temperature=0, messages=[{"role": "user", "content": "hello world"}],
        extra_body={"omnipipe": {"sampling_params": sampling}})
    return base64.b64decode(reply.choices[0].message.audio.data)


def check_server_voices(url: str, model: str, voices: list[str], default: str, other: str,
                        sampling: dict[str, Any]) -> None:
    listed = httpx.get(f"{url}/v1/audio/voices", params={"model": model},
                       headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30).json()
    assert [v["id"] for v in listed["voices"]] == ["default", *voices], listed
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    said = speak(client, model, default, sampling)
    assert len(said) > 44 + 1000  # more than a WAV header
    assert speak(client, model, default.upper(), sampling) == said
    assert speak(client, model, "alloy", sampling) == said == speak(client, model, "default", sampling)
    assert speak(client, model, other, sampling) != said
    with pytest.raises(openai.BadRequestError) as caught:
        speak(client, model, "nobody", sampling)
    assert caught.value.body["param"] == "audio.voice" and other in caught.value.body["message"]
    talker = {**sampling.get("talker", {}), "extra": {"speaker": default}}
    with pytest.raises(openai.BadRequestError) as caught:
        speak(client, model, other, {**sampling, "talker": talker})
    assert caught.value.body["param"] == "audio.voice" and "conflicts" in caught.value.body["message"]

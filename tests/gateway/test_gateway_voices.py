"""A voice made from a clip through the gateway, with two tiny Qwen2.5-Omni workers that keep their voices apart
(each its own cache directory): the upload reaches both, so either can speak with it (the same waveform from each),
the same upload again is answered 200, a refusal comes back naming its field, and a deletion leaves neither with it."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from tests.gateway.conftest import GatewayProcess, WorkerProcess, running
from tests.models.media_files import wav
from tests.server.conftest import spoken

pytestmark = pytest.mark.slow  # two tiny Qwen2.5-Omni workers and a gateway

CHAT = {"model": "qwen2_5_omni", "modalities": ["text", "audio"], "audio": {"voice": "mine", "format": "wav"},
        "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "hello"}],
        "omnipipe": {"sampling_params": {"talker": {"temperature": 0, "max_tokens": 20}, "token2wav": {"seed": 1}}}}


def _voices(address: str) -> list[tuple[str, str | None]]:
    listed = httpx.get(f"http://{address}/v1/audio/voices", params={"model": "qwen2_5_omni"}, timeout=30).json()
    return [(v["id"], v["base_voice"]) for v in listed["voices"]]


def _spoken_by(address: str) -> bytes:
    reply = httpx.post(f"http://{address}/v1/chat/completions", json=CHAT, timeout=120)
    assert reply.status_code == 200, reply.text
    return base64.b64decode(reply.json()["choices"][0]["message"]["audio"]["data"])


def test_a_voice_uploaded_through_the_gateway_reaches_every_worker(tmp_path, monkeypatch) -> None:
    from omnipipe.models.qwen2_5_omni.weights.tiny import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt", seed=0)
    deploy = {"stages": {name: {"options": {"model": str(checkpoint)}} for name in ("thinker", "talker", "token2wav")}}
    workers = []
    for index in range(2):
        monkeypatch.setenv("OMNIPIPE_CACHE", str(tmp_path / f"cache-{index}"))
        workers.append(WorkerProcess("qwen2_5_omni", tmp_path, deploy=deploy))
    gateway = GatewayProcess([w.address for w in workers], tmp_path)
    clip = wav(spoken("This is the voice I would like you to speak with.", 24_000, steady=True), 24_000)
    with running(gateway, *workers):
        gateway.wait_ready(600)
        upload = {"data": {"name": "mine", "base_voice": "Ethan"}, "files": {"audio": ("clip.wav", clip)}}
        made = httpx.post(f"{gateway.url}/v1/audio/voices", timeout=120, **upload)
        assert made.status_code == 201 and made.json()["base_voice"] == "Ethan", made.text
        for worker in workers:
            assert ("mine", "Ethan") in _voices(worker.address)
            assert (tmp_path / f"cache-{workers.index(worker)}" / "voices" / "qwen2_5_omni" / "mine" / "clip").is_file()
        assert httpx.post(f"{gateway.url}/v1/audio/voices", timeout=120, **upload).status_code == 200
        said = [_spoken_by(worker.address) for worker in workers]
        assert len(said[0]) > 44 + 1000 and said[0] == said[1]
        refused = httpx.post(f"{gateway.url}/v1/audio/voices", data={"name": "short"},
                             files={"audio": ("clip.wav", wav(np.zeros(2_400, np.float32), 24_000))}, timeout=120)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "audio", refused.text
        deleted = httpx.delete(f"{gateway.url}/v1/audio/voices/mine", timeout=60)
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True, deleted.text
        for worker in workers:
            assert "mine" not in [name for name, _ in _voices(worker.address)]
        assert httpx.delete(f"{gateway.url}/v1/audio/voices/mine", timeout=60).status_code == 404

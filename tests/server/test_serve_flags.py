"""``omnipipe serve`` flags on par with ``vllm serve``: served model names, CORS, the API key from the environment,
HTTPS options; and ``GET /v1/models/{id}``. One toy server with the flags, driven by the real ``openai`` client."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import TOY_DEPLOY, ServerProcess, running_server

pytestmark = pytest.mark.slow  # omnipipe serve started once per flag

ORIGIN = "https://app.example.com"
ENV_KEY = "key-from-the-environment"


@pytest.fixture(scope="module")
def flagged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    os.environ["OMNIPIPE_API_KEY"] = ENV_KEY  # the server process inherits it; no --api-key given
    try:
        with running_server("toy", TOY_DEPLOY, tmp_path_factory.mktemp("flagged"), 120, api_key=None,
                            extra_args=["--served-model-name", "omni-toy", "tts-1", "whisper-1",
                                        "--allowed-origins", ORIGIN, "--no-async-chunk"]) as server:
            server.headers = {"Authorization": f"Bearer {ENV_KEY}"}
            yield server
    finally:
        del os.environ["OMNIPIPE_API_KEY"]


@pytest.fixture(scope="module")
def client(flagged: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{flagged.url}/v1", api_key=ENV_KEY)


def test_the_api_key_comes_from_the_environment(flagged: ServerProcess) -> None:
    body = {"model": "omni-toy", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{flagged.url}/v1/chat/completions", json=body, timeout=30).status_code == 401
    wrong = httpx.post(f"{flagged.url}/v1/chat/completions", json=body, timeout=30,
                       headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401


def test_the_first_served_name_is_the_model_and_the_others_are_accepted(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data][0] == "omni-toy"
    for name in ("omni-toy", "tts-1", "whisper-1"):
        completion = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "ok"}],
                                                    max_tokens=5)
        assert completion.choices[0].message.content == "OK"
    with client.audio.speech.with_streaming_response.create(model="tts-1", input="hello", voice="alloy",
                                                            response_format="wav") as speech:
        assert speech.read()[:4] == b"RIFF"
    spoken = client.chat.completions.create(model="omni-toy", messages=[{"role": "user", "content": "whole"}],
                                            modalities=["text", "audio"], audio={"voice": "default", "format": "wav"})
    assert spoken.choices[0].message.audio.transcript == "WHOLE"  # --no-async-chunk: passed whole between stages
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert missing.value.body["param"] == "model"


def test_a_model_is_retrieved_by_id(client: openai.OpenAI) -> None:
    model = client.models.retrieve("omni-toy")
    assert model.id == "omni-toy" and model.object == "model"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert missing.value.body["code"] == "model_not_found" and "omni-toy" in missing.value.body["message"]


def test_cors_answers_the_allowed_origin_only(flagged: ServerProcess) -> None:
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    allowed = httpx.options(f"{flagged.url}/v1/chat/completions", headers=preflight, timeout=10)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in allowed.headers["access-control-allow-methods"]
    other = httpx.options(f"{flagged.url}/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"},
                          timeout=10)
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    listed = httpx.get(f"{flagged.url}/v1/models", headers={"Origin": ORIGIN, **flagged.headers}, timeout=10)
    assert listed.headers["access-control-allow-origin"] == ORIGIN


def test_a_server_without_allowed_origins_sends_no_cors_headers(toy_server: ServerProcess) -> None:
    reply = httpx.get(f"{toy_server.url}/v1/models", headers={"Origin": ORIGIN, **toy_server.headers}, timeout=10)
    assert reply.status_code == 200 and "access-control-allow-origin" not in reply.headers


@pytest.mark.parametrize(("args", "message"), [
    (["--ssl-keyfile", "key.pem"], "--ssl-keyfile and --ssl-certfile: give both or neither"),
    (["--ssl-keyfile", "key.pem", "--ssl-certfile", "cert.pem"], "--ssl-keyfile: no such file"),
    (["--allowed-origins", "*", "--allow-credentials"], "--allow-credentials: browsers refuse credentials"),
])
def test_bad_serve_flags_are_refused_before_anything_starts(tmp_path: Path, args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "serve", "--pipeline", "toy", *args],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr

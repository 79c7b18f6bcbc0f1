"""A family whose voices are fixed (the default family's Piper voice) refuses a voice upload naming ``audio``, and
keeps nothing: its voices are listed as before and a delete finds no voice made from a clip."""

from __future__ import annotations

import pytest

from tests.models.media_files import wav
from tests.server.conftest import spoken

pytestmark = pytest.mark.slow  # the default family's server


def test_the_default_family_refuses_a_reference_voice(default_server) -> None:
    clip = wav(spoken("A voice to speak with.", 24_000, steady=True), 24_000)
    with default_server.client() as client:
        before = client.get("/v1/audio/voices").json()
        response = client.post("/v1/audio/voices", data={"name": "mine"}, files={"audio": ("clip.wav", clip)})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "audio" and error["code"] == "unsupported_reference_voice"
        assert "cannot take a reference voice" in error["message"] and "default" in error["message"]
        assert client.get("/v1/audio/voices").json() == before
        assert "mine" not in [v["id"] for v in before["voices"]]
        missing = client.delete("/v1/audio/voices/mine")
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "name"

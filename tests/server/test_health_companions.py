"""``/health`` and the companions a worker preloads: it says loading until they have loaded, and lists each
companion's status. No engine is started: the slots' states are set by hand (the default pipeline's specs only)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from omnipipe.server.app import create_app
from omnipipe.server.engines import ServerConfig


class _Engine:
    """Stands in for a started AsyncOmni: healthy, nothing to report."""

    def health(self) -> Any:
        return None


def _app(preload: tuple[str, ...]) -> Any:
    app = create_app(ServerConfig(pipeline="default", capacity=2, preload_companions=preload))
    pool = app.state.pool
    pool.main.status, pool.main.engine = "ready", _Engine()
    return app, pool


def test_health_says_loading_until_the_preloaded_transcription_companion_is_ready() -> None:
    app, pool = _app(("transcription",))
    asr = pool.companions()["transcription"]
    client = TestClient(app)  # no lifespan: nothing starts
    for status in ("idle", "loading"):
        asr.status = status
        reply = client.get("/health")
        assert reply.status_code == 503
        body = reply.json()
        assert (body["status"], body["state"]) == ("loading", "LOADING")
        assert body["companions"]["transcription"] == {"pipeline": "asr", "status": status, "preloaded": True}
    asr.status = "ready"
    reply = client.get("/health")
    assert reply.status_code == 200
    body = reply.json()
    assert (body["status"], body["state"]) == ("ready", "IDLE")
    assert body["companions"] == {"speech": {"pipeline": "tts", "status": "idle", "preloaded": False},
                                  "transcription": {"pipeline": "asr", "status": "ready", "preloaded": True}}


def test_a_companion_that_failed_or_is_not_preloaded_does_not_hold_the_worker_back() -> None:
    app, pool = _app(("transcription",))
    asr = pool.companions()["transcription"]
    asr.status, asr.error = "failed", "RuntimeError: no weights"
    body = TestClient(app).get("/health").json()
    assert body["status"] == "ready"  # its endpoint answers 503 naming the failure; the rest serves
    assert body["companions"]["transcription"]["error"] == "RuntimeError: no weights"
    app, pool = _app(())
    pool.companions()["transcription"].status = "loading"  # started by a first request
    assert TestClient(app).get("/health").json()["status"] == "ready"

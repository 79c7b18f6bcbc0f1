"""/health and /metrics tell the truth about a stalled stage: 503 "degraded" naming it while it is stopped,
200 "ready" again once it resumes, and the stall counted in the metrics."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import ServerProcess, running_server
from tests.waiting import wait_for

LIVENESS_DEPLOY = {
    "heartbeat_interval_s": 0.1,
    "stages": {"thinker": {"stall_report_s": 0.5, "stall_restart_s": None, "options": {"step_delay_ms": 2}},
               "talker": {"stall_report_s": 0.5, "stall_restart_s": None}},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server("toy", LIVENESS_DEPLOY, Path(tmp_path_factory.mktemp("liveness")), 120) as server:
        yield server


def health(server: ServerProcess) -> httpx.Response:
    return httpx.get(f"{server.url}/health", timeout=10)


def wait_health(server: ServerProcess, status: str, timeout_s: float = 60) -> dict[str, Any]:
    def said() -> dict[str, Any] | None:
        body = health(server).json()
        return body if body["status"] == status else None

    return wait_for(said, timeout_s, f"/health said {status!r}", detail=lambda: health(server).text)


def metric(text: str, name: str, stage: str) -> float:
    labels = {"model_name": "toy", "pipeline": "toy", "stage": stage}
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and s.labels == labels]
    assert len(samples) == 1, (name, stage, text)
    return samples[0].value


def test_health_reports_every_stage(server: ServerProcess) -> None:
    response = health(server)
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ready" and body["problems"] == []
    assert set(body["stages"]) == {"thinker", "talker", "code2wav"}
    for report in body["stages"].values():
        assert report["state"] == "ok" and report["pid"] > 0 and report["restarts"] == 0
        assert 0 <= report["heartbeat_age_s"] < 30


def test_a_stopped_stage_degrades_health_until_it_resumes(server: ServerProcess) -> None:
    pid = health(server).json()["stages"]["talker"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        body = wait_health(server, "degraded")
        response = health(server)
        metrics = httpx.get(f"{server.url}/metrics", headers=server.headers, timeout=30).text
    finally:
        os.kill(pid, signal.SIGCONT)
    assert response.status_code == 503
    assert body["state"] == "ERROR" and body["stages"]["talker"]["state"] == "stalled"
    assert body["stages"]["thinker"]["state"] == "ok"
    assert "stage 'talker' has made no progress" in body["error"]
    assert metric(metrics, "omnipipe:stage_stalled", "talker") == 1
    assert metric(metrics, "omnipipe:stage_up", "talker") == 0
    assert metric(metrics, "omnipipe:stage_up", "thinker") == 1

    body = wait_health(server, "ready")
    assert body["stages"]["talker"]["pid"] == pid and body["stages"]["talker"]["stalls"] == 1
    assert health(server).status_code == 200
    metrics = httpx.get(f"{server.url}/metrics", headers=server.headers, timeout=30).text
    assert metric(metrics, "omnipipe:stage_stalled", "talker") == 0
    assert metric(metrics, "omnipipe:stage_stalls_total", "talker") == 1
    # and it serves in full afterwards
    with server.client() as client:
        reply = client.post("/v1/chat/completions", json={"model": "toy", "messages": [
            {"role": "user", "content": "back again"}], "modalities": ["text"]})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "BACK AGAIN"

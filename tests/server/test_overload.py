"""When the engine is at its admission limit the server answers 429 with Retry-After, and serves again after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import ServerProcess, engines_idle, running_server

pytestmark = pytest.mark.slow  # a server driven past its admission limit

# one request at a time, and a slow thinker so the first is surely still running when the second arrives
DEPLOY = {"max_pending_requests": 1, "stages": {"thinker": {"options": {"step_delay_ms": 20}}}}


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_server("toy", DEPLOY, Path(tmp_path_factory.mktemp("busy-server")), 120, api_key=None) as server:
        yield server


def test_overload_is_429_with_retry_after(busy_server: ServerProcess) -> None:
    long_body = {"model": "toy", "messages": [{"role": "user", "content": "x " * 100}], "max_tokens": 200,
                 "stream": True}
    with httpx.Client(base_url=busy_server.url, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions", json=long_body) as first:
            assert first.status_code == 200
            lines = first.iter_lines()  # kept referenced: dropping it would close the connection (an abort)
            next(lines)  # the request is admitted and running
            second = http.post("/v1/chat/completions", json={"model": "toy", "messages": [
                {"role": "user", "content": "hi"}]})
            assert second.status_code == 429, second.text
            assert second.headers["retry-after"] == "1"
            assert second.json()["error"]["code"] == "engine_overloaded"
            assert sum(1 for _ in lines) > 0
        assert engines_idle(busy_server.wait_idle())
        again = http.post("/v1/chat/completions",
                          json={"model": "toy", "messages": [{"role": "user", "content": "hi"}]})
        assert again.status_code == 200 and again.json()["choices"][0]["message"]["content"] == "HI"

"""Property-based fuzzing of every route in the server's own OpenAPI schema with schemathesis: valid and invalid
requests generated from the schema must never get a 5xx, and the server answers in full afterwards.

``/metrics`` is left out only because it is plain text without a request schema worth fuzzing. The cases come from
``APIOperation.as_strategy`` under plain Hypothesis ``@given`` (schemathesis's own pytest loader does not run under
pytest 9)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.server.conftest import ServerProcess, engines_idle

pytestmark = pytest.mark.slow  # schemathesis generates requests against a running server

MAX_EXAMPLES = 50  # per operation and mode: the whole module takes well under a minute on the toy server
EXCLUDED_PATHS = {"/metrics"}


@pytest.fixture(scope="module")
def operations(toy_server: ServerProcess) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{toy_server.url}/openapi.json", headers=toy_server.headers, timeout=30)
    found = [result.ok() for result in schema.get_all_operations()]
    return [op for op in found if op.path not in EXCLUDED_PATHS]


def served_names(case: Any) -> Any:
    """Point a generated body at the served model and a real voice, so valid requests reach the engine (random
    names would mostly get 404 model_not_found)."""
    if isinstance(case.body, dict):
        if "model" in case.body:
            case.body["model"] = "toy"
        if "voice" in case.body:
            case.body["voice"] = "default"
        if isinstance(case.body.get("audio"), dict) and "voice" in case.body["audio"]:
            case.body["audio"]["voice"] = "default"
    return case


def fuzz(operation: Any, mode: GenerationMode, server: ServerProcess, served: bool = False) -> None:
    strategy = operation.as_strategy(generation_mode=mode)

    @given(case=strategy.map(served_names) if served else strategy)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def check(case: Any) -> None:
        response = case.call(base_url=server.url, headers=dict(server.headers), timeout=60)
        assert response.status_code < 500, (f"{case.method} {case.formatted_path} ({mode.value}) -> "
                                            f"{response.status_code}: {response.text[:500]}\n"
                                            f"{case.as_curl_command()}")

    check()


def test_the_schema_lists_the_api_routes(operations: list[Any]) -> None:
    paths = {op.path for op in operations}
    assert {"/v1/chat/completions", "/v1/audio/speech", "/v1/audio/transcriptions", "/v1/models",
            "/health"} <= paths, paths


@pytest.mark.parametrize(("mode", "served"), [(GenerationMode.POSITIVE, False), (GenerationMode.POSITIVE, True),
                                               (GenerationMode.NEGATIVE, False), (GenerationMode.NEGATIVE, True)],
                         ids=["positive", "positive-served-model", "negative", "negative-served-model"])
def test_no_generated_request_gets_a_server_error(operations: list[Any], mode: GenerationMode, served: bool,
                                                  toy_server: ServerProcess) -> None:
    failures = []
    for operation in operations:
        try:
            fuzz(operation, mode, toy_server, served)
        except AssertionError as exc:
            failures.append(str(exc))
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE  # an operation without parameters has no invalid requests
    assert not failures, "\n\n".join(failures)


def test_server_still_serves_after_fuzzing(toy_server: ServerProcess) -> None:
    with toy_server.client() as http:
        assert http.get("/health").status_code == 200
        response = http.post("/v1/chat/completions", json={
            "model": "toy", "messages": [{"role": "user", "content": "after fuzzing"}], "max_tokens": 50})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "AFTER FUZZING"
    assert engines_idle(toy_server.wait_idle(timeout_s=30))
    assert httpx.get(f"{toy_server.url}/health", timeout=10).json()["status"] == "ready"

"""Request-header limits on the worker (the gateway has the same middleware: tests/gateway/test_gateway_security.py):
a huge header or thousands of headers get 431 with OpenAI's error object, and the server keeps serving."""

from __future__ import annotations

import socket
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from omnipipe.protocol.header_limits import MAX_HEADER_BYTES, MAX_HEADERS


def get_models(url: str, headers: list[tuple[str, str]]) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=30) as client:
        return client.get("/v1/models", headers=headers)


@pytest.mark.parametrize("headers", [
    [("X-Big", "a" * 70_000)],
    [(f"X-H{i}", "1") for i in range(3000)],
    [(f"X-H{i}", "v" * 400) for i in range(MAX_HEADER_BYTES // 400 + 1)],
], ids=["one 70 KB header", "3000 headers", "many medium headers past the byte limit"])
def test_oversized_headers_get_431(toy_server: Any, headers: list[tuple[str, str]]) -> None:
    response = get_models(toy_server.url, [*toy_server.headers.items(), *headers])
    assert response.status_code == 431, response.text
    assert response.json()["error"]["code"] == "request_headers_too_large"
    assert get_models(toy_server.url, list(toy_server.headers.items())).status_code == 200  # still serving


def test_headers_within_the_limits_are_served(toy_server: Any) -> None:
    headers = [(f"X-H{i}", "v" * 100) for i in range(MAX_HEADERS - 10)]
    assert get_models(toy_server.url, [*toy_server.headers.items(), *headers]).status_code == 200


def test_a_huge_header_that_arrives_in_pieces_gets_the_same_431(toy_server: Any) -> None:
    """The HTTP parser sees a block that comes in several reads before it is whole: it must not cut it with its own
    400 (and a reset) below our limit's 431."""
    url = urlsplit(toy_server.url)
    auth = "".join(f"{name}: {value}\r\n" for name, value in toy_server.headers.items())
    block = f"GET /v1/models HTTP/1.1\r\nHost: {url.hostname}\r\n{auth}X-Big: {'a' * 70_000}\r\n\r\n".encode()
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        for start in range(0, len(block), 20_000):
            sock.sendall(block[start:start + 20_000])
            time.sleep(0.05)
        answer = b""
        while b"\r\n\r\n" not in answer:
            piece = sock.recv(65536)
            assert piece, answer
            answer += piece
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]

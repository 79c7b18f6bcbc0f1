"""HTTP versions on the worker (the gateway has the same middleware: tests/gateway/test_gateway_security.py): a
request line in a version no one speaks (``HTTP/9.9``, which uvicorn's h11 parser takes as written) gets 505 and
never a 2xx; HTTP/1.0 and HTTP/1.1 are served as usual."""

from __future__ import annotations

import socket
from typing import Any

import pytest


def raw_status_line(port: int, version: str, path: str, headers: dict[str, str]) -> str:
    """The status line the server answers ``GET path HTTP/<version>`` with, sent as raw bytes over a socket."""
    lines = [f"GET {path} HTTP/{version}", "Host: 127.0.0.1", "Connection: close",
             *(f"{name}: {value}" for name, value in headers.items())]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
        answer = b""
        while b"\r\n" not in answer and (data := sock.recv(65536)):
            answer += data
    return answer.split(b"\r\n", 1)[0].decode("latin-1")


@pytest.mark.parametrize("version", ["9.9", "0.9", "2.0", "1.9"])
def test_unsupported_http_versions_get_505(toy_server: Any, version: str) -> None:
    status = raw_status_line(toy_server.port, version, "/v1/models", toy_server.headers)  # authorised: 200 if served
    assert status.split(" ")[1] == "505", status


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_http_1_0_and_1_1_are_served(toy_server: Any, version: str) -> None:
    status = raw_status_line(toy_server.port, version, "/v1/models", toy_server.headers)
    assert status.split(" ")[1] == "200", status

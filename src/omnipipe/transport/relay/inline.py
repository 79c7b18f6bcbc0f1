"""Inline relay: the bytes ride inside the control message itself. For payloads under the inline threshold."""

from __future__ import annotations

from typing import Any

from omnipipe.transport.relay.base import Relay, RelayError


class InlineRelay(Relay):
    name = "inline"

    def put(self, pieces: list[tuple[int, memoryview]], nbytes: int, request_id: str) -> dict[str, Any]:
        buffer = bytearray(nbytes)
        for offset, piece in pieces:
            buffer[offset : offset + len(piece)] = piece
        return {"data": bytes(buffer)}

    def get(self, metadata: dict[str, Any], nbytes: int, request_id: str) -> bytearray:
        data = metadata.get("data")
        if not isinstance(data, (bytes, bytearray)) or len(data) != nbytes:
            carried = len(data) if isinstance(data, (bytes, bytearray)) else "no"
            raise RelayError(f"inline payload carries {carried} bytes, expected {nbytes}")
        return bytearray(data)

    def cleanup(self, request_id: str) -> None:
        return None

    def close(self) -> None:
        return None


def make_sender(run_id: str, owner: str, options: dict[str, Any]) -> InlineRelay:
    return InlineRelay()


def make_receiver(run_id: str, owner: str, zero_copy: bool) -> InlineRelay:
    return InlineRelay()

"""``ResponseStore``: the Responses API's stored responses (``store: true``), in memory, bounded.

Each entry holds the response object (``GET /v1/responses/{id}``) and the conversation's items up to and including
its output (the earlier responses' items, its own input items, its output items), so a follow-up naming it as
``previous_response_id`` continues from there even after the earlier responses were evicted. At most
``MAX_STORED_RESPONSES`` entries and ``MAX_STORED_BYTES`` bytes (their JSON) are kept; the oldest go first. An
entry larger than the byte bound alone is not stored. Everything runs on the server's event loop: no lock.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_STORED_RESPONSES = 1000
MAX_STORED_BYTES = 64 << 20


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]
    items: list[dict[str, Any]]  # the conversation through this response's output, as input items
    size: int


class ResponseStore:
    def __init__(self, max_entries: int = MAX_STORED_RESPONSES, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    def put(self, response: dict[str, Any], items: list[dict[str, Any]]) -> bool:
        """Keep ``response`` (by its ``id``) with its conversation's ``items``, evicting the oldest entries to make
        room; False when it is too large to keep at all."""
        size = len(json.dumps(response, separators=(",", ":"))) + len(json.dumps(items, separators=(",", ":")))
        if size > self.max_bytes:
            return False
        self.delete(response["id"])
        while self._entries and (len(self._entries) >= self.max_entries or self._bytes + size > self.max_bytes):
            _, oldest = self._entries.popitem(last=False)
            self._bytes -= oldest.size
        self._entries[response["id"]] = StoredResponse(response, items, size)
        self._bytes += size
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True

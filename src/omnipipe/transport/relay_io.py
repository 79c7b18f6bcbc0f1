"""Stage-facing helpers: turn a nested object into a ``Payload`` through a relay, and back."""

from __future__ import annotations

from typing import Any

from omnipipe.transport import payload_codec
from omnipipe.transport.messages import Payload
from omnipipe.transport.relay.base import Relay, RelayError
from omnipipe.transport.relay.inline import InlineRelay
from omnipipe.transport.relay.local import LocalRelay

_inline = InlineRelay()
_local = LocalRelay()


def write_payload(obj: Any, relay: Relay | LocalRelay, request_id: str, inline_threshold_bytes: int) -> Payload:
    """Encode ``obj``; small buffers ride inline, larger ones go through ``relay``."""
    if isinstance(relay, LocalRelay):
        return Payload(b"", [], 0, "local", relay=relay.put_object(obj, request_id))
    encoded = payload_codec.encode(obj)
    if encoded.nbytes <= inline_threshold_bytes or isinstance(relay, InlineRelay):
        return Payload(encoded.skeleton, encoded.tensors, encoded.nbytes, "inline", data=encoded.join())
    pieces = [(info.offset, buf) for info, buf in zip(encoded.tensors, encoded.buffers)]
    metadata = relay.put(pieces, encoded.nbytes, request_id)
    return Payload(encoded.skeleton, encoded.tensors, encoded.nbytes, relay.name, relay=metadata)


def read_payload(payload: Payload, relays: dict[str, Relay], request_id: str) -> Any:
    """Fetch and restore a payload. ``relays`` maps backend name -> this end's relay instance."""
    if payload.backend == "local":
        return _local.get_object(payload.relay or {}, request_id)
    if payload.backend == "inline":
        if payload.data is None or len(payload.data) != payload.nbytes:
            raise RelayError("inline payload is missing its bytes or has the wrong size")
        buffer: bytes | bytearray = payload.data
    else:
        relay = relays.get(payload.backend)
        if relay is None:
            raise RelayError(f"payload came through relay {payload.backend!r}, which this stage does not have")
        buffer = relay.get(payload.relay or {}, payload.nbytes, request_id)
    return payload_codec.decode(payload.skeleton, payload.tensors, buffer)

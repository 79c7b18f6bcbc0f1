"""Stage-facing helpers: turn a nested object into a ``Payload`` through a relay, and back."""

from __future__ import annotations

from typing import Any

from omnipipe.transport import payload_codec
from omnipipe.transport.messages import Payload
from omnipipe.transport.relay.base import Relay, RelayError


def write_payload(obj: Any, relay: Relay, request_id: str, inline_threshold_bytes: int) -> Payload:
    """Encode ``obj``; a ``keeps_device`` relay takes its tensors as objects, otherwise small buffers ride
    inline and larger ones go through ``relay``."""
    if relay.keeps_device:
        encoded = payload_codec.encode(obj, keep_device=True)
        metadata = relay.put_objects(encoded.kept, request_id)
        return Payload(encoded.skeleton, encoded.tensors, 0, relay.name, relay=metadata)
    encoded = payload_codec.encode(obj)
    if encoded.nbytes <= inline_threshold_bytes or relay.name == "inline":
        return Payload(encoded.skeleton, encoded.tensors, encoded.nbytes, "inline", data=encoded.join())
    metadata = relay.put(encoded.pieces(), encoded.nbytes, request_id)
    return Payload(encoded.skeleton, encoded.tensors, encoded.nbytes, relay.name, relay=metadata)


def read_payload(payload: Payload, relays: dict[str, Relay], request_id: str) -> Any:
    """Fetch and restore a payload. ``relays`` maps backend name -> this end's relay (``create_receivers``)."""
    if payload.backend == "inline":
        if payload.data is None or len(payload.data) != payload.nbytes:
            raise RelayError("inline payload is missing its bytes or has the wrong size")
        return payload_codec.decode(payload.skeleton, payload.tensors, payload.data)
    relay = relays.get(payload.backend)
    if relay is None:
        raise RelayError(f"payload came through relay {payload.backend!r}, which this end does not have")
    if relay.keeps_device:
        kept = relay.get_objects(payload.relay or {}, request_id)
        return payload_codec.decode(payload.skeleton, payload.tensors, b"", kept)
    buffer = relay.get(payload.relay or {}, payload.nbytes, request_id)
    return payload_codec.decode(payload.skeleton, payload.tensors, buffer)

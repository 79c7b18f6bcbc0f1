"""Relay backends: move one flat byte buffer between processes; the control message carries the metadata."""

from omnipipe.transport.relay.base import Relay, RelayError
from omnipipe.transport.relay.registry import RELAY_BACKENDS, create_receivers, create_relay

__all__ = ["Relay", "RelayError", "RELAY_BACKENDS", "create_receivers", "create_relay"]

"""Control plane (ZMQ + msgspec messages), payload codec and relay backends."""

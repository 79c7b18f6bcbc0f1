"""Free loopback ports, for benchmarks and tests that start servers of their own."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` consecutive free loopback ports (``omnipipe up`` puts its workers on consecutive ports)."""
    for _ in range(100):
        first = free_port()
        ports = list(range(first, first + count))
        if all(port_is_free(port) for port in ports[1:]):
            return ports
    raise OSError(f"found no {count} consecutive free ports")


def port_is_free(port: int) -> bool:
    """Whether ``port`` on the loopback interface can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True

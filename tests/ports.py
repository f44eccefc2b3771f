"""Loopback ports for tests: free ones to hand a server, and a taken one to be refused."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


def free_ports(count: int = 1) -> list[int]:
    """``count`` distinct loopback ports nothing listens on (held together while chosen)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


@contextlib.contextmanager
def listening_port() -> Iterator[int]:
    """A loopback port something listens on, for as long as the block runs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])

"""A transport that records what the wire writes (for wires fed frames by hand)."""

from __future__ import annotations


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def abort(self) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True

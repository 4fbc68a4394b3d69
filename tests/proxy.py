"""A TCP proxy in front of a broker that holds a batch mid-way, for restart tests.

Clients connect to :attr:`HoldingProxy.url`. Once ``hold_after`` ``basic.publish``
frames have gone through (all connections together), the proxy stops forwarding what
clients send (it stops reading them: TCP holds the rest back) and sets
:attr:`HoldingProxy.holding`. It lets go by itself when the broker begins closing a
held connection (a ``connection.close`` on channel 0: the node is stopping), so the
node can finish stopping; or when :meth:`HoldingProxy.release` is called. The hold is
made once; later connections are forwarded as they come (and refused while the
broker is down, as the broker itself would).

So a test restarts a node while a batch is certainly mid-way, without timing anything:
wait for ``holding``, then stop the node.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import struct
import threading
from urllib.parse import urlsplit, urlunsplit

FRAME_METHOD = 1
FRAME_END = 0xCE
BASIC_PUBLISH = (60, 40)
CONNECTION_CLOSE = (10, 50)


class _Frames:
    """Walks an AMQP 0-9-1 byte stream and counts the method frames it is told to."""

    def __init__(self) -> None:
        self._buffer = b""
        self._header_seen = False

    def methods(self, data: bytes) -> list[tuple[int, int, int]]:
        """The (channel, class, method) of each whole method frame in ``data`` so far."""
        self._buffer += data
        if not self._header_seen and self._buffer.startswith(b"AMQP"):
            if len(self._buffer) < 8:
                return []
            self._buffer = self._buffer[8:]
            self._header_seen = True
        found = []
        while len(self._buffer) >= 7:
            kind, channel, size = struct.unpack_from(">BHI", self._buffer)
            if len(self._buffer) < 8 + size:
                break
            if kind == FRAME_METHOD and size >= 4:
                cls, method = struct.unpack_from(">HH", self._buffer, 7)
                found.append((channel, cls, method))
            assert self._buffer[7 + size] == FRAME_END, "not an AMQP 0-9-1 stream"
            self._buffer = self._buffer[8 + size :]
        return found


class HoldingProxy:
    def __init__(
        self, broker_url: str, hold_after: int, *, read_while_holding: bool = False
    ) -> None:
        """``read_while_holding``: go on reading (and counting in :attr:`published`) what
        clients send while holding, keeping it until the release instead of leaving it in
        TCP's buffers: a test can then wait until a number of publishes is held."""
        parts = urlsplit(broker_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        netloc = parts.netloc.rsplit(":", 1)[0] + f":{port}"
        self.url = urlunsplit(parts._replace(netloc=netloc))
        self.hold_after = hold_after
        self.published = 0
        """``basic.publish`` frames forwarded to the broker so far."""
        self.read_while_holding = read_while_holding
        self.holding = threading.Event()
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._closed = True
        self._released.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> HoldingProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the broker is down: refused, as it would be
                continue
            self._sockets += [client, upstream]
            for source, sink, outgoing in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(
                    target=self._pump, args=(source, sink, outgoing), daemon=True
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, outgoing: bool) -> None:
        frames = _Frames()
        forward: queue.Queue[bytes | None] | None = None
        if outgoing and self.read_while_holding:
            forward = queue.Queue()
            threading.Thread(target=self._forward, args=(forward, sink), daemon=True).start()
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                methods = frames.methods(data)
                if forward is not None:
                    self._count(methods)
                    forward.put(data)
                    continue
                if outgoing:
                    self._count_and_hold(methods)
                elif self.holding.is_set() and (0, *CONNECTION_CLOSE) in methods:
                    self._released.set()  # the node is stopping: let it finish
                sink.sendall(data)
        except OSError:
            pass
        finally:
            if forward is not None:
                forward.put(None)  # the forwarder shuts both down once it sent the rest
            else:
                _shut(source, sink)

    def _count(self, methods: list[tuple[int, int, int]]) -> None:
        publishes = sum(1 for _ch, cls, m in methods if (cls, m) == BASIC_PUBLISH)
        with self._lock:
            self.published += publishes
            if self.published >= self.hold_after:
                self.holding.set()

    def _forward(self, forward: queue.Queue[bytes | None], sink: socket.socket) -> None:
        """Send on what the pump read, in order, holding it while the proxy holds."""
        try:
            while (data := forward.get()) is not None:
                if self.holding.is_set():
                    self._released.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _shut(sink)

    def _count_and_hold(self, methods: list[tuple[int, int, int]]) -> None:
        publishes = sum(1 for _ch, cls, m in methods if (cls, m) == BASIC_PUBLISH)
        with self._lock:
            self.published += publishes
            hold = not self.holding.is_set() and self.published >= self.hold_after
            if hold:
                self.holding.set()
        if hold or (self.holding.is_set() and not self._released.is_set() and publishes):
            self._released.wait()


def _shut(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

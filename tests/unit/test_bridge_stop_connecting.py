"""A stop reaches a bridge still connecting (no broker needed): a broker that takes the
TCP connection and never answers held the stop for its connect attempts (10 s each,
three of them), longer than a worker waits for a stopping bridge."""

from __future__ import annotations

import socket
import threading
import time

from delayq import Topology
from delayq.sync.bridge import Bridge


def test_a_stop_ends_a_bridge_connecting_to_a_broker_that_never_answers() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # takes connections (the kernel's backlog), says nothing
    port = silent.getsockname()[1]
    topology = Topology.model_validate(
        {
            "namespace": "stopconn",
            "destinations": [{"queue": "stopconn.work", "bindings": ["a"]}],
            "intakes": [{"exchange": "plugin-stopconn"}],
        }
    )
    bridge = Bridge(f"amqp://guest:guest@127.0.0.1:{port}/", topology)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            bridge.run(install_signal_handlers=False)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    try:
        thread.start()
        time.sleep(0.5)  # connecting: the handshake waits for the broker's first frame
        assert thread.is_alive() and not raised
        stopped = time.monotonic()
        bridge.request_stop()
        thread.join(30)
        assert not thread.is_alive(), "the stop waited for the connect attempts"
        assert time.monotonic() - stopped < 5
    finally:
        silent.close()
    assert raised == [] and not bridge.started.is_set()

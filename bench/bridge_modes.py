"""The relays ``bench/bridge.py`` times, each in a thread of its own: two written by hand
on pika (a blocking confirm per publish; pipelined confirms) and delayq's bridge.

Each does the same job: consume the intake queue (prefetch ``prefetch``), publish every
delivery to the tier its ``x-delay`` names with ``mandatory``, on a confirm channel,
and ack the delivery only once the broker confirmed its publish. The raw relays check
nothing and carry the properties as they came: what a relay written by hand does.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import pika
from pika.spec import Basic

from delayq import Topology
from delayq.sync.bridge import Bridge

__all__ = ["MODES", "BridgeRelay", "ConfirmEachRelay", "PipelinedRelay", "RelayRun"]


class RelayRun:
    """A relay in a thread: ``consuming`` is set once its consume is on, ``acked`` counts
    the deliveries it acked, ``problems`` says what went wrong (a crash, a return)."""

    label = "?"

    def __init__(self, url: str, topology: Topology, queue: str, prefetch: int) -> None:
        self.url, self.queue, self.prefetch = url, queue, prefetch
        self.tiers = {t.ttl_ms: topology.tier_name(t) for t in topology.ladder.tiers}
        self.topology = topology
        self.consuming = threading.Event()
        self.problems: list[str] = []
        self._acked = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._guarded, daemon=True)

    @property
    def acked(self) -> int:
        return self._acked

    def tier_for(self, props: Any) -> str:
        """The smallest tier at or above the message's ``x-delay`` (a dict lookup)."""
        delay = int(props.headers["x-delay"])
        return self.tiers[min(ms for ms in self.tiers if ms >= delay)]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        self._wake()
        self._thread.join(30)
        if self._thread.is_alive():
            self.problems.append("the relay did not stop within 30 s")

    def _guarded(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.problems.append(f"the relay failed: {exc!r}")
            self.consuming.set()

    def _run(self) -> None:
        raise NotImplementedError

    def _wake(self) -> None:
        """Make the relay's loop see the halt (it polls it by default)."""


class ConfirmEachRelay(RelayRun):
    """Raw pika, blocking: a consuming connection, a publishing one on a confirm channel;
    each message of the batch in hand published with pika's blocking confirm (one round
    trip per publish), then the batch acked."""

    label = "raw pika, confirm each"

    def _run(self) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        out = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            channel, publish = connection.channel(), out.channel()
            publish.confirm_delivery()
            channel.basic_qos(prefetch_count=self.prefetch)
            batch: list[tuple[int, Any, bytes, str]] = []
            channel.basic_consume(
                self.queue, lambda ch, m, p, b: batch.append((m.delivery_tag, p, b, m.routing_key))
            )
            self.consuming.set()
            while not self._halt.is_set():
                connection.process_data_events(time_limit=0.01)
                if not batch:
                    continue
                taken, batch[:] = list(batch), []
                for _tag, props, body, key in taken:
                    publish.basic_publish(self.tier_for(props), key, body, props, mandatory=True)
                channel.basic_ack(taken[-1][0], multiple=True)
                self._acked += len(taken)
        finally:
            for each in (connection, out):
                if each.is_open:
                    each.close()


class PipelinedRelay(RelayRun):
    """Raw pika, asynchronous (``SelectConnection``): one connection, a consuming channel
    and a confirm channel. Each delivery is published as it arrives, with no wait; each
    confirm (``multiple`` or not) acks, with one ``multiple`` ack, the deliveries whose
    publishes are confirmed in order. The window is the prefetch: the fastest raw pika
    relay that acks only what the broker confirmed."""

    label = "raw pika, pipelined confirms"

    def __init__(self, url: str, topology: Topology, queue: str, prefetch: int) -> None:
        super().__init__(url, topology, queue, prefetch)
        self._connection: Any = None
        self._consume: Any = None
        self._publish: Any = None
        self._seq = 0
        self._pending: deque[tuple[int, int]] = deque()  # (publish seq, delivery tag)
        self._settled: dict[int, bool] = {}  # publish seq -> confirmed (False: nacked)

    def _run(self) -> None:
        self._connection = pika.SelectConnection(
            pika.URLParameters(self.url),
            on_open_callback=lambda c: c.channel(on_open_callback=self._on_consume_channel),
            on_open_error_callback=lambda _c, exc: self._fail(f"cannot connect: {exc!r}"),
            on_close_callback=lambda c, _exc: c.ioloop.stop(),
        )
        if self._halt.is_set():
            return
        self._connection.ioloop.start()

    def _fail(self, problem: str) -> None:
        self.problems.append(problem)
        self.consuming.set()
        self._connection.ioloop.stop()

    def _wake(self) -> None:
        connection = self._connection
        if connection is not None:
            connection.ioloop.add_callback_threadsafe(
                lambda: connection.close() if connection.is_open else connection.ioloop.stop()
            )

    def _on_consume_channel(self, channel: Any) -> None:
        self._consume = channel
        self._connection.channel(on_open_callback=self._on_publish_channel)

    def _on_publish_channel(self, channel: Any) -> None:
        self._publish = channel
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=lambda _f: self._qos())

    def _qos(self) -> None:
        self._consume.basic_qos(prefetch_count=self.prefetch, callback=lambda _f: self._start())

    def _start(self) -> None:
        self._consume.basic_consume(
            self.queue, self._on_message, callback=lambda _f: self.consuming.set()
        )

    def _on_message(self, _channel: Any, method: Any, props: Any, body: bytes) -> None:
        self._publish.basic_publish(
            self.tier_for(props), method.routing_key, body, props, mandatory=True
        )
        self._seq += 1
        self._pending.append((self._seq, method.delivery_tag))

    def _on_return(self, _channel: Any, method: Any, _props: Any, _body: bytes) -> None:
        self.problems.append(f"a publish to {method.exchange!r} was returned: {method.reply_text}")

    def _on_confirm(self, frame: Any) -> None:
        confirm = frame.method
        taken = isinstance(confirm, Basic.Ack)
        if confirm.multiple:
            for seq, _tag in self._pending:
                if seq > confirm.delivery_tag:
                    break
                self._settled.setdefault(seq, taken)
        else:
            self._settled[confirm.delivery_tag] = taken
        last = None  # the latest delivery to ack, with `multiple`, in one frame
        while self._pending and self._pending[0][0] in self._settled:
            seq, tag = self._pending.popleft()
            if self._settled.pop(seq):
                last = tag
                self._acked += 1
                continue
            if last is not None:
                self._consume.basic_ack(last, multiple=True)
                last = None
            self.problems.append(f"delivery {tag} nacked by the broker: requeued")
            self._consume.basic_nack(tag, requeue=True)
        if last is not None:
            self._consume.basic_ack(last, multiple=True)


class BridgeRelay(RelayRun):
    """delayq's :class:`~delayq.sync.bridge.Bridge`: the ``x-delay`` read as the plugin
    did, the tier, the message id, the properties carried, the DLQ for what cannot be
    scheduled, each delivery streamed as it arrives (a window of the prefetch)."""

    label = "delayq bridge"

    def __init__(self, url: str, topology: Topology, queue: str, prefetch: int) -> None:
        super().__init__(url, topology, queue, prefetch)
        self.bridge = Bridge(url, topology, prefetch=prefetch)
        self.consuming = self.bridge.started

    @property
    def acked(self) -> int:
        return self.bridge.stats.forwarded + self.bridge.stats.parked

    def stop(self) -> None:
        super().stop()
        if self.bridge.stats.parked:
            self.problems.append(f"the bridge parked {self.bridge.stats.parked} message(s)")

    def _run(self) -> None:
        self.bridge.run(install_signal_handlers=False)

    def _wake(self) -> None:
        self.bridge.request_stop()


MODES: dict[str, type[RelayRun]] = {
    "raw-each": ConfirmEachRelay,
    "raw-pipelined": PipelinedRelay,
    "bridge": BridgeRelay,
}
"""The ``--modes`` names; the report shows each class's ``label``."""

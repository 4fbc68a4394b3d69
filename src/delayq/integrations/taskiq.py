"""taskiq on RabbitMQ with its delays in delayq's tiers (``pip install 'delayq[taskiq]'``).

:class:`DelayqBroker` is taskiq-aio-pika's ``AioPikaBroker`` whose delayed kicks
(``task.kicker().with_labels(delay=...)``, ``SmartRetryMiddleware``'s and
``SimpleRetryMiddleware``'s retries, the scheduler's sends) wait in the tier at or above
their delay, then reach the task queue through ``<ns>.ready``. With taskiq-aio-pika's own
delay queue every delayed message waits in one FIFO queue with its own expiration, so a
long delay holds every shorter one behind it (taskiq-aio-pika #25); with no delay queue a
delayed kick is refused.

>>> topology = Topology(namespace="tasks")
>>> broker = DelayqBroker("amqp://localhost", topology=topology)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import aio_pika
from taskiq import BrokerMessage
from taskiq_aio_pika import AioPikaBroker

from delayq.aio.provision import apply_topology_async
from delayq.aio.publisher import AsyncPublisher
from delayq.errors import InvalidDelay, InvalidInput
from delayq.integrations._routes import framework_topology, seconds_delay
from delayq.topology.model import Topology
from delayq.urls import resolve_url

__all__ = ["DelayqBroker"]

log = logging.getLogger("delayq.integrations.taskiq")


class DelayqBroker(AioPikaBroker):
    """An ``AioPikaBroker`` whose delayed kicks go through delayq's tiers.

    ``topology`` names the namespace and the ladder; each task queue is added to it as an
    ``existing: true`` destination bound by the queue's routing key (taskiq declares the
    queue). ``startup()`` applies it (``apply=False``: ``delayq topology apply`` did, after
    taskiq declared its queues) and opens an :class:`~delayq.aio.AsyncPublisher`
    (``publisher_options``: its keyword arguments). Every other argument is
    ``AioPikaBroker``'s, but ``delay_queue`` and ``delayed_message_exchange_plugin``:
    delayq replaces them. A kick without a ``delay`` label goes as taskiq sends it.
    """

    def __init__(
        self,
        url: str | None = None,
        *args: Any,
        topology: Topology,
        apply: bool = True,
        publisher_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        for name in ("delay_queue", "delayed_message_exchange_plugin"):
            if kwargs.get(name):
                raise InvalidInput(f"DelayqBroker: {name} is what delayq replaces; leave it out")
        resolved = resolve_url(url)
        super().__init__(resolved, *args, **kwargs)
        self._delayq_url = resolved
        self._delayq_given = topology
        self._delayq_apply = apply
        self._delayq_options = dict(publisher_options or {})
        self._delayq: AsyncPublisher | None = None

    @property
    def delayq_topology(self) -> Topology:
        """The topology with the task queues (known once ``startup()`` declared them)."""
        routes = {q.name: q.routing_key or q.name for q in self._task_queues}
        return framework_topology(self._delayq_given, routes, "taskiq")

    async def startup(self) -> None:
        """taskiq's start-up (its exchange and queues), then delayq's topology and publisher."""
        await super().startup()
        topology = self.delayq_topology
        if self._delayq_apply:
            await apply_topology_async(topology, self._delayq_url)
        publisher = AsyncPublisher(self._delayq_url, topology, **self._delayq_options)
        await publisher.connect()
        self._delayq = publisher

    async def shutdown(self) -> None:
        """Close delayq's publisher (what it sent was confirmed), then taskiq's connections."""
        publisher, self._delayq = self._delayq, None
        if publisher is not None:
            await publisher.aclose()
        await super().shutdown()

    async def kick(self, message: BrokerMessage) -> None:
        """Send ``message``: through a tier when it has a ``delay`` label (``x_delay`` in
        later taskiq-aio-pika releases), else as taskiq does. Waits for the confirm."""
        labels = message.labels
        headers = {"task_id": message.task_id, "task_name": message.task_name, **labels}
        try:
            raw = labels.get("x_delay", labels.get("delay"))
            delay = seconds_delay(raw, f"task {message.task_name!r} ({message.task_id})")
            if delay is None:
                await super().kick(message)
                return
            publisher = self._delayq
            if publisher is None:
                raise InvalidInput("DelayqBroker: call startup() before kicking a delayed task")
            built = publisher.factory.build(
                message.message, self._routing_key(labels), delay, message_id=message.task_id,
                headers=headers,
            )  # fmt: skip
        except InvalidDelay as exc:
            if "_retries" not in labels:  # a kick of the caller's: the caller hears it
                raise
            await self._park(message, headers, f"retry not scheduled: {exc}")
            return
        priority = labels.get(self._label_for_priority)
        if priority is not None:
            built = replace(built, properties={"priority": _priority(priority)})
        await publisher.send(built)

    async def _park(self, message: BrokerMessage, headers: dict[str, Any], reason: str) -> None:
        """A retry whose delay the topology cannot hold, into taskiq's dead-letter queue
        with the reason (confirmed), instead of an error in the retry middleware that
        leaves the delivery unacked (run again at every worker restart)."""
        assert self.write_channel is not None
        dead = self._dead_letter_queue
        await self.write_channel.default_exchange.publish(
            aio_pika.Message(
                message.message, headers={**headers, "x-delayq-reason": reason},
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=dead.routing_key or dead.name,
        )  # fmt: skip
        log.error("task %s: %s; put in %s", message.task_id, reason, dead.name)

    def _routing_key(self, labels: dict[str, Any]) -> str:
        """The routing key taskiq's own ``kick`` picks: the one queue's, else the
        ``queue_name`` label (``label_for_routing``)."""
        if len(self._task_queues) == 1:
            queue = self._task_queues[0]
            return str(queue.routing_key or queue.name)
        key = labels.get(self._label_for_routing)
        if not key:
            raise InvalidInput(
                f"DelayqBroker: {len(self._task_queues)} task queues and no "
                f"{self._label_for_routing!r} label: which queue is the task for?"
            )
        return str(key)


def _priority(raw: object) -> int:
    try:
        value = int(str(raw))
    except ValueError:
        value = -1
    if not 0 <= value <= 255:
        raise InvalidInput(f"priority label {raw!r} is not an integer 0-255")
    return value

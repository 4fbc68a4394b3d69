"""delayq: delayed delivery and retries on RabbitMQ, with no plugin.

>>> from delayq import Publisher, load_topology      # doctest: +SKIP
>>> with Publisher(topology=load_topology()) as pub:  # doctest: +SKIP
...     pub.publish({"order": 42}, "orders.remind", "15m")

The core (durations, ladder, topology, envelope) imports no broker client; the
adapters ``Publisher`` (pika) and ``AsyncPublisher`` (aio-pika) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from delayq.declarations import build_declarations
from delayq.definitions import export_definitions, render_definitions
from delayq.durations import format_ms, to_ms
from delayq.envelope import Message, Receipt
from delayq.errors import (
    BodyTooLarge,
    BrokerError,
    ConnectionFailed,
    DelayqError,
    DelayTooLong,
    InvalidBody,
    InvalidDelay,
    InvalidHeaders,
    InvalidInput,
    InvalidMessageId,
    InvalidRoutingKey,
    InvalidTopology,
    InvalidURL,
    PublishBatchError,
    PublishError,
    PublishRejected,
    PublishUnconfirmed,
    TopologyConflict,
    TopologyMissing,
    Unroutable,
)
from delayq.ladder import DEFAULT_LADDER, Ladder, Tier
from delayq.provisioning import ApplyReport, ApplyResult, ApplyStatus
from delayq.retry import (
    ROCKETMQ_SCHEDULE,
    ExponentialBackoff,
    FixedBackoff,
    RetryPolicy,
    ScheduleBackoff,
    ScheduleRow,
)
from delayq.topology import Destination, QueueType, Topology, load_topology

if TYPE_CHECKING:
    from delayq.aio.publisher import AsyncPublisher
    from delayq.sync.provision import apply_topology
    from delayq.sync.publisher import Publisher

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_LADDER",
    "ROCKETMQ_SCHEDULE",
    "ApplyReport",
    "ApplyResult",
    "ApplyStatus",
    "AsyncPublisher",
    "BodyTooLarge",
    "BrokerError",
    "ConnectionFailed",
    "DelayTooLong",
    "DelayqError",
    "Destination",
    "ExponentialBackoff",
    "FixedBackoff",
    "InvalidBody",
    "InvalidDelay",
    "InvalidHeaders",
    "InvalidInput",
    "InvalidMessageId",
    "InvalidRoutingKey",
    "InvalidTopology",
    "InvalidURL",
    "Ladder",
    "Message",
    "PublishBatchError",
    "PublishError",
    "PublishRejected",
    "PublishUnconfirmed",
    "Publisher",
    "QueueType",
    "Receipt",
    "RetryPolicy",
    "ScheduleBackoff",
    "ScheduleRow",
    "Tier",
    "Topology",
    "TopologyConflict",
    "TopologyMissing",
    "Unroutable",
    "apply_topology",
    "build_declarations",
    "export_definitions",
    "format_ms",
    "load_topology",
    "render_definitions",
    "to_ms",
]

_LAZY = {
    "Publisher": "delayq.sync.publisher",
    "apply_topology": "delayq.sync.provision",
    "AsyncPublisher": "delayq.aio.publisher",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'delayq' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

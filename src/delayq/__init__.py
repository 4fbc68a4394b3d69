"""delayq: delayed delivery and retries on RabbitMQ, with no plugin.

>>> from delayq import Publisher, load_topology      # doctest: +SKIP
>>> with Publisher(topology=load_topology()) as pub:  # doctest: +SKIP
...     pub.publish({"order": 42}, "orders.remind", "15m")

The core (durations, ladder, topology, envelope) imports no broker client; the
adapters load on first use: ``Publisher`` and ``Consumer`` on pika, ``AsyncPublisher``
and ``AsyncConsumer`` on asyncio through delayq's own AMQP client over pamqp
(``apply_topology_async`` declares the topology through aio-pika).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from delayq.consume.delivery import Reject, Retry
from delayq.consume.retry import (
    ROCKETMQ_SCHEDULE,
    ExponentialBackoff,
    FixedBackoff,
    RetryPolicy,
    ScheduleBackoff,
    ScheduleRow,
)
from delayq.errors import (
    AccessRefused,
    BodyTooLarge,
    BrokerError,
    ClaimLost,
    ConnectionFailed,
    DelayqError,
    DelayTooLong,
    ExecutorEnvironment,
    HandlersStuck,
    HandlerTimeout,
    HeaderFrameTooLarge,
    HeadersTooLarge,
    InvalidBody,
    InvalidDelay,
    InvalidHeaders,
    InvalidInput,
    InvalidMessageId,
    InvalidRoutingKey,
    InvalidTopology,
    InvalidURL,
    ManagementUnavailable,
    MissingExtra,
    ParkedAtRisk,
    PublishBackpressure,
    PublishBatchError,
    PublishBlocked,
    PublishError,
    PublishNotSent,
    PublishRejected,
    PublishUnconfirmed,
    RecordsLost,
    RowsRejected,
    RowsUnconfirmed,
    SparkJobFailed,
    StoreError,
    TopologyConflict,
    TopologyMissing,
    TopologyNotApplied,
    UnboundRoutingKey,
    Unroutable,
)
from delayq.message.cancel import CancelReceipt, RescheduleReceipt
from delayq.message.envelope import Message, Receipt
from delayq.message.inflight import InFlightLimit
from delayq.message.limits import MessageLimits
from delayq.message.reschedule import Reschedule
from delayq.observe.deliveries import DeliveryObserver, Settled
from delayq.observe.publishes import Published, PublishObserver, PublishOutcome
from delayq.observe.stats import ConsumerStats
from delayq.stores.base import CancelStatus, ClaimStatus, IdempotencyStore
from delayq.stores.key_scope import KeyScope, copy_unscoped_keys
from delayq.stores.memory import InMemoryStore
from delayq.stores.sqlite import SQLiteStore
from delayq.topology.declarations import build_declarations
from delayq.topology.definitions import export_definitions, render_definitions
from delayq.topology.ladder import DEFAULT_LADDER, Ladder, Tier
from delayq.topology.model import (
    Destination,
    ExactSettings,
    QueueType,
    Strategy,
    Topology,
    load_topology,
)
from delayq.topology.report import ApplyReport, ApplyResult, ApplyStatus
from delayq.worker import Worker

if TYPE_CHECKING:
    from delayq.aio.consumer import AsyncConsumer
    from delayq.aio.provision import apply_topology_async
    from delayq.aio.publisher import AsyncPublisher
    from delayq.stores.postgres import PostgresStore
    from delayq.stores.redis import RedisStore
    from delayq.sync.consumer import Consumer
    from delayq.sync.provision import apply_topology
    from delayq.sync.publisher import Publisher

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_LADDER",
    "ROCKETMQ_SCHEDULE",
    "AccessRefused",
    "ApplyReport",
    "ApplyResult",
    "ApplyStatus",
    "AsyncConsumer",
    "AsyncPublisher",
    "BodyTooLarge",
    "BrokerError",
    "CancelReceipt",
    "CancelStatus",
    "ClaimLost",
    "ClaimStatus",
    "ConnectionFailed",
    "Consumer",
    "ConsumerStats",
    "DelayTooLong",
    "DelayqError",
    "DeliveryObserver",
    "Destination",
    "ExactSettings",
    "ExecutorEnvironment",
    "ExponentialBackoff",
    "FixedBackoff",
    "HandlerTimeout",
    "HandlersStuck",
    "HeaderFrameTooLarge",
    "HeadersTooLarge",
    "IdempotencyStore",
    "InFlightLimit",
    "InMemoryStore",
    "InvalidBody",
    "InvalidDelay",
    "InvalidHeaders",
    "InvalidInput",
    "InvalidMessageId",
    "InvalidRoutingKey",
    "InvalidTopology",
    "InvalidURL",
    "KeyScope",
    "Ladder",
    "ManagementUnavailable",
    "Message",
    "MessageLimits",
    "MissingExtra",
    "ParkedAtRisk",
    "PostgresStore",
    "PublishBackpressure",
    "PublishBatchError",
    "PublishBlocked",
    "PublishError",
    "PublishNotSent",
    "PublishObserver",
    "PublishOutcome",
    "PublishRejected",
    "PublishUnconfirmed",
    "Published",
    "Publisher",
    "QueueType",
    "Receipt",
    "RecordsLost",
    "RedisStore",
    "Reject",
    "Reschedule",
    "RescheduleReceipt",
    "Retry",
    "RetryPolicy",
    "RowsRejected",
    "RowsUnconfirmed",
    "SQLiteStore",
    "ScheduleBackoff",
    "ScheduleRow",
    "Settled",
    "SparkJobFailed",
    "StoreError",
    "Strategy",
    "Tier",
    "Topology",
    "TopologyConflict",
    "TopologyMissing",
    "TopologyNotApplied",
    "UnboundRoutingKey",
    "Unroutable",
    "Worker",
    "apply_topology",
    "apply_topology_async",
    "build_declarations",
    "copy_unscoped_keys",
    "export_definitions",
    "load_topology",
    "render_definitions",
]

_LAZY = {
    "RedisStore": "delayq.stores.redis",
    "PostgresStore": "delayq.stores.postgres",
    "Consumer": "delayq.sync.consumer",
    "AsyncConsumer": "delayq.aio.consumer",
    "Publisher": "delayq.sync.publisher",
    "apply_topology": "delayq.sync.provision",
    "apply_topology_async": "delayq.aio.provision",
    "AsyncPublisher": "delayq.aio.publisher",
}


def _named_by_the_package(value: Any) -> None:
    """httpx's habit: a class the package exports is shown as ``delayq.Publisher`` in
    reprs and tracebacks, wherever it is defined. Only plain classes and errors:
    dataclasses, enums and pydantic models keep their module, which their type hints
    are resolved in."""
    if (
        isinstance(value, type)
        and value.__module__.startswith("delayq.")
        and not dataclasses.is_dataclass(value)
        and not issubclass(value, (enum.Enum, BaseModel))
    ):
        value.__module__ = "delayq"


for _name in __all__:
    if _name in globals():
        _named_by_the_package(globals()[_name])


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'delayq' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    _named_by_the_package(value)
    globals()[name] = value
    return value

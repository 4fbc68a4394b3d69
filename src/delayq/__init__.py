"""delayq: delayed delivery and retries on RabbitMQ, with no plugin.

>>> from delayq import Publisher, load_topology      # doctest: +SKIP
>>> with Publisher(topology=load_topology()) as pub:  # doctest: +SKIP
...     pub.publish({"order": 42}, "orders.remind", "15m")

The core (durations, ladder, topology, envelope) imports no broker client; the
adapters load on first use: ``Publisher`` and ``Consumer`` on pika, ``AsyncPublisher``
and ``AsyncConsumer`` on asyncio through delayq's own AMQP client over pamqp
(``apply_topology_async`` declares the topology through aio-pika).

Every name here is loaded on first use (PEP 562): ``import delayq`` runs no import of
its own, so ``delayq --help`` and a program that needs one module of delayq do not pay
for pydantic, the stores and the clients (``python -X importtime`` shows it).
"""

# No import runs here, not even ``from __future__ import annotations`` (it imports the
# __future__ module) or typing for TYPE_CHECKING (type checkers read any name
# TYPE_CHECKING as true): the command line's Ctrl-C handling starts after this module
# (see delayq.cli), and ``import delayq`` costs nothing. Annotations naming what is
# imported for type checkers alone are strings.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from delayq.aio.consumer import AsyncConsumer
    from delayq.aio.provision import apply_topology_async
    from delayq.aio.publisher import AsyncPublisher
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
        ConnectionRejected,
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
        PublisherInUse,
        PublishError,
        PublishNotSent,
        PublishRejected,
        PublishUnconfirmed,
        RecordsLost,
        RowsRejected,
        RowsUnconfirmed,
        ScheduleNotRecorded,
        SparkJobFailed,
        StoreError,
        TopologyConflict,
        TopologyMissing,
        TopologyNotApplied,
        UnboundRoutingKey,
        Unroutable,
        UnsendableMessage,
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
    from delayq.stores.postgres import PostgresStore
    from delayq.stores.redis import RedisStore
    from delayq.stores.sqlite import SQLiteStore
    from delayq.sync.consumer import Consumer
    from delayq.sync.provision import apply_topology
    from delayq.sync.publisher import Publisher
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
    "ConnectionRejected",
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
    "PublisherInUse",
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
    "ScheduleNotRecorded",
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
    "UnsendableMessage",
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
    "AccessRefused": "delayq.errors",
    "ApplyReport": "delayq.topology.report",
    "ApplyResult": "delayq.topology.report",
    "ApplyStatus": "delayq.topology.report",
    "AsyncConsumer": "delayq.aio.consumer",
    "AsyncPublisher": "delayq.aio.publisher",
    "BodyTooLarge": "delayq.errors",
    "BrokerError": "delayq.errors",
    "CancelReceipt": "delayq.message.cancel",
    "CancelStatus": "delayq.stores.base",
    "ClaimLost": "delayq.errors",
    "ClaimStatus": "delayq.stores.base",
    "ConnectionFailed": "delayq.errors",
    "ConnectionRejected": "delayq.errors",
    "Consumer": "delayq.sync.consumer",
    "ConsumerStats": "delayq.observe.stats",
    "DEFAULT_LADDER": "delayq.topology.ladder",
    "DelayTooLong": "delayq.errors",
    "DelayqError": "delayq.errors",
    "DeliveryObserver": "delayq.observe.deliveries",
    "Destination": "delayq.topology.model",
    "ExactSettings": "delayq.topology.model",
    "ExecutorEnvironment": "delayq.errors",
    "ExponentialBackoff": "delayq.consume.retry",
    "FixedBackoff": "delayq.consume.retry",
    "HandlerTimeout": "delayq.errors",
    "HandlersStuck": "delayq.errors",
    "HeaderFrameTooLarge": "delayq.errors",
    "HeadersTooLarge": "delayq.errors",
    "IdempotencyStore": "delayq.stores.base",
    "InFlightLimit": "delayq.message.inflight",
    "InMemoryStore": "delayq.stores.memory",
    "InvalidBody": "delayq.errors",
    "InvalidDelay": "delayq.errors",
    "InvalidHeaders": "delayq.errors",
    "InvalidInput": "delayq.errors",
    "InvalidMessageId": "delayq.errors",
    "InvalidRoutingKey": "delayq.errors",
    "InvalidTopology": "delayq.errors",
    "InvalidURL": "delayq.errors",
    "KeyScope": "delayq.stores.key_scope",
    "Ladder": "delayq.topology.ladder",
    "ManagementUnavailable": "delayq.errors",
    "Message": "delayq.message.envelope",
    "MessageLimits": "delayq.message.limits",
    "MissingExtra": "delayq.errors",
    "ParkedAtRisk": "delayq.errors",
    "PostgresStore": "delayq.stores.postgres",
    "PublishBackpressure": "delayq.errors",
    "PublishBatchError": "delayq.errors",
    "PublishBlocked": "delayq.errors",
    "PublishError": "delayq.errors",
    "PublishNotSent": "delayq.errors",
    "PublishObserver": "delayq.observe.publishes",
    "PublishOutcome": "delayq.observe.publishes",
    "PublishRejected": "delayq.errors",
    "PublishUnconfirmed": "delayq.errors",
    "PublisherInUse": "delayq.errors",
    "Published": "delayq.observe.publishes",
    "Publisher": "delayq.sync.publisher",
    "QueueType": "delayq.topology.model",
    "ROCKETMQ_SCHEDULE": "delayq.consume.retry",
    "Receipt": "delayq.message.envelope",
    "RecordsLost": "delayq.errors",
    "RedisStore": "delayq.stores.redis",
    "Reject": "delayq.consume.delivery",
    "Reschedule": "delayq.message.reschedule",
    "RescheduleReceipt": "delayq.message.cancel",
    "Retry": "delayq.consume.delivery",
    "RetryPolicy": "delayq.consume.retry",
    "RowsRejected": "delayq.errors",
    "RowsUnconfirmed": "delayq.errors",
    "SQLiteStore": "delayq.stores.sqlite",
    "ScheduleBackoff": "delayq.consume.retry",
    "ScheduleNotRecorded": "delayq.errors",
    "ScheduleRow": "delayq.consume.retry",
    "Settled": "delayq.observe.deliveries",
    "SparkJobFailed": "delayq.errors",
    "StoreError": "delayq.errors",
    "Strategy": "delayq.topology.model",
    "Tier": "delayq.topology.ladder",
    "Topology": "delayq.topology.model",
    "TopologyConflict": "delayq.errors",
    "TopologyMissing": "delayq.errors",
    "TopologyNotApplied": "delayq.errors",
    "UnboundRoutingKey": "delayq.errors",
    "Unroutable": "delayq.errors",
    "UnsendableMessage": "delayq.errors",
    "Worker": "delayq.worker",
    "apply_topology": "delayq.sync.provision",
    "apply_topology_async": "delayq.aio.provision",
    "build_declarations": "delayq.topology.declarations",
    "copy_unscoped_keys": "delayq.stores.key_scope",
    "export_definitions": "delayq.topology.definitions",
    "load_topology": "delayq.topology.model",
    "render_definitions": "delayq.topology.definitions",
}
"""Each exported name and the module defining it."""


def _named_by_the_package(value: "Any") -> None:
    """httpx's habit: a class the package exports is shown as ``delayq.Publisher`` in
    reprs and tracebacks, wherever it is defined. Only plain classes and errors:
    dataclasses, enums and pydantic models keep their module, which their type hints
    are resolved in. (The errors name themselves so: see :mod:`delayq.errors`.)"""
    import dataclasses
    import enum
    import sys

    pydantic = sys.modules.get("pydantic")  # not loaded: value is no pydantic model
    models = (pydantic.BaseModel,) if pydantic is not None else ()
    if (
        isinstance(value, type)
        and value.__module__.startswith("delayq.")
        and not dataclasses.is_dataclass(value)
        and not issubclass(value, (enum.Enum, *models))
    ):
        value.__module__ = "delayq"


def __getattr__(name: str) -> "Any":
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'delayq' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    _named_by_the_package(value)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

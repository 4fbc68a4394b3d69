"""The asyncio adapter: publisher and consumer on delayq's own AMQP client over pamqp
(:mod:`delayq.aio._wire`), provisioning (``apply_topology_async``) through aio-pika."""

from __future__ import annotations

from delayq.aio.consumer import AsyncConsumer
from delayq.aio.provision import apply_topology_async
from delayq.aio.publisher import AsyncPublisher

__all__ = ["AsyncConsumer", "AsyncPublisher", "apply_topology_async"]

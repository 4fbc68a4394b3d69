"""The asyncio adapter: publisher, consumer (on delayq's own AMQP client), provisioning."""

from __future__ import annotations

from delayq.aio.consumer import AsyncConsumer
from delayq.aio.provision import apply_topology_async
from delayq.aio.publisher import AsyncPublisher

__all__ = ["AsyncConsumer", "AsyncPublisher", "apply_topology_async"]

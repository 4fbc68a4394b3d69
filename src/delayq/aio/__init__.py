"""The asyncio adapter, on aio-pika: ``AsyncPublisher`` and ``apply_topology``."""

from __future__ import annotations

from delayq.aio.provision import apply_topology
from delayq.aio.publisher import AsyncPublisher

__all__ = ["AsyncPublisher", "apply_topology"]

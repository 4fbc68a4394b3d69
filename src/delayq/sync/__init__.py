"""The blocking adapter, on pika: publisher, consumer, provisioning and operations."""

from __future__ import annotations

from delayq.sync.consumer import Consumer
from delayq.sync.depths import queue_depths
from delayq.sync.provision import apply_topology, delete_topology
from delayq.sync.publisher import Publisher
from delayq.sync.verify import verify_topology

__all__ = [
    "Consumer",
    "Publisher",
    "apply_topology",
    "delete_topology",
    "queue_depths",
    "verify_topology",
]

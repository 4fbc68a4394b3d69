"""The blocking adapter, on pika: publisher, consumer and provisioning."""

from __future__ import annotations

from delayq.sync.consumer import Consumer
from delayq.sync.provision import apply_topology, delete_topology
from delayq.sync.publisher import Publisher

__all__ = ["Consumer", "Publisher", "apply_topology", "delete_topology"]

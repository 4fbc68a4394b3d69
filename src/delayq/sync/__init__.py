"""The blocking adapter, on pika: ``Publisher``, ``apply_topology`` and ``delete_topology``."""

from __future__ import annotations

from delayq.sync.provision import apply_topology, delete_topology
from delayq.sync.publisher import Publisher

__all__ = ["Publisher", "apply_topology", "delete_topology"]

"""The blocking adapter, on pika: ``Publisher`` and ``apply_topology``."""

from __future__ import annotations

from delayq.sync.provision import apply_topology
from delayq.sync.publisher import Publisher

__all__ = ["Publisher", "apply_topology"]

"""RabbitMQ's topic matching, for the memory broker: the pure matcher lives in the core
(:mod:`delayq.topology.topic`), where publishers check routing keys against the topology."""

from __future__ import annotations

from delayq.topology.topic import topic_matches

__all__ = ["topic_matches"]

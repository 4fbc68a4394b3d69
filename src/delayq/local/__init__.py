"""Servers started from the installed binaries, for demos and tests, without root or Docker:
a RabbitMQ node (``node``), a three-node cluster (``cluster``), which RabbitMQ they run
(``rabbitmq``: the installed one, 4.0 or 4.3), Redis and PostgreSQL (``servers``), and
throwaway TLS certificates (``tls``).

The classes a user reaches for first are here too::

    from delayq.local import LocalNode, LocalCluster
"""

from delayq.local.cluster import LocalCluster
from delayq.local.node import LocalNode, LocalNodeError, NodeTLS

__all__ = ["LocalCluster", "LocalNode", "LocalNodeError", "NodeTLS"]

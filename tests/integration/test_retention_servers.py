"""A real RedisStore's ``retention_ms`` (a TTL on marks) against the consumer's topology:
too short is refused when the consumer is built, like ``retention`` itself (see
``tests/unit/test_retention_check.py`` and ``docs/concepts/cancel.md``, Expiry)."""

from __future__ import annotations

import pytest

from delayq import Topology
from delayq.errors import InvalidInput
from delayq.testing import MemoryBroker
from tests.integration import store_servers as servers

# the servers' store fixtures (tests/integration/store_servers.py)
redis_client = servers.redis_client
redis_store = servers.redis_store

TOPOLOGY = Topology(
    namespace="retsrv",
    ladder=["1m", "24h"],
    destinations=[{"queue": "orders", "bindings": ["order.*"]}],
)


def test_a_redis_ttl_shorter_than_a_mark_must_last_is_refused(redis_store):
    short = redis_store(retention_ms=3_600_000)
    enough = redis_store(retention_ms=7 * 86_400_000)
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        with pytest.raises(InvalidInput, match=r"RedisStore\(.*\) retention_ms 1h .* at least"):
            broker.consumer(TOPOLOGY, "orders", lambda body: None, store=short)
        broker.consumer(TOPOLOGY, "orders", lambda body: None, store=enough)
        broker.consumer(TOPOLOGY, "orders", lambda body: None, store=short, check_retention=False)

"""Undoing a cancel on the Redis and PostgreSQL stores against real servers.

Every case of the unit contract (``tests/unit/test_uncancel_store.py``, the tests that
take ``store`` or ``opener``) runs here again on both stores, with the server fixtures
and the ``opener`` of ``tests/integration/test_cancel_servers.py``; then a Redis mark
with a retention TTL, which an uncancel removes with the rest of the key.
"""

from __future__ import annotations

from delayq.stores.base import ClaimStatus
from delayq.stores.uncancel import UncancelStatus
from tests.integration import store_servers as servers
from tests.unit import test_uncancel_store as contract

# the servers' store fixtures (tests/integration/store_servers.py)
opener = servers.opener
postgres_store = servers.postgres_store
redis_client = servers.redis_client
redis_store = servers.redis_store
store = servers.store

CONTRACT = servers.contract_cases(contract, "store", "opener")
globals().update(CONTRACT)


def test_the_contract_was_picked_up():
    assert len(CONTRACT) >= 9, sorted(CONTRACT)


def test_redis_uncancel_removes_a_mark_kept_with_a_ttl(redis_store, redis_client):
    store = redis_store(retention_ms=3_600_000)
    store.cancel("k", now_ms=0)
    assert redis_client.pttl(store.prefix + "k") > 1_000_000
    assert store.uncancel_batch(["k"], now_ms=1) == [UncancelStatus.UNCANCELLED]
    assert not redis_client.exists(store.prefix + "k")
    assert store.claim("k", lease_ms=1_000, now_ms=2) is ClaimStatus.CLAIMED


def test_postgres_uncancel_answers_repeated_keys_alike(postgres_store):
    store = postgres_store()
    store.cancel("k", now_ms=0)
    assert store.uncancel_batch(["k", "k"], now_ms=1) == [UncancelStatus.UNCANCELLED] * 2

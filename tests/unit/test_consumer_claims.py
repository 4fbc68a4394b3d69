"""AsyncConsumer gives back a claim whose delivery was cancelled while the claim ran.

aiormq cancels every delivery in flight when a connection is lost. A claim made
in the store's thread lands anyway; if the consumer kept it, the key would stay
busy until its lease ends (6 min by default) and every redelivery of it would
be deferred until then. No broker: the delivery is a stand-in object.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from delayq import Topology
from delayq.aio import AsyncConsumer
from delayq.idempotency import ClaimStatus, InMemoryStore


class SlowClaims(InMemoryStore):
    """An in-memory store whose claims run in a thread and wait for a gate."""

    blocking = True

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()

    def claim(self, key: str, *, lease_ms: int, now_ms: int) -> ClaimStatus:
        self.entered.set()
        self.gate.wait(5)
        return super().claim(key, lease_ms=lease_ms, now_ms=now_ms)


@dataclass
class Delivery:
    body: bytes = b'{"order": "a-1"}'
    routing_key: str = "job.x"
    message_id: str = "m-1"
    content_type: str = "application/json"
    headers: dict[str, Any] = field(default_factory=dict)
    redelivered: bool = False


def test_a_claim_that_lands_after_its_delivery_was_cancelled_is_given_back():
    handled: list[Any] = []

    async def handler(body: Any) -> None:
        handled.append(body)

    async def scenario() -> ClaimStatus:
        store = SlowClaims()
        topology = Topology(
            namespace="t", ladder=["1s"], destinations=[{"queue": "t.work", "bindings": ["#"]}]
        )
        consumer = AsyncConsumer(
            "amqp://guest:guest@127.0.0.1:1/",
            topology,
            "t.work",
            handler,
            store=store,
            key=lambda body: body["order"],
        )
        task = asyncio.ensure_future(consumer._process(Delivery()))  # type: ignore[arg-type]
        assert await asyncio.to_thread(store.entered.wait, 5)
        task.cancel()  # the connection was lost while the claim ran in its thread
        store.gate.set()
        try:
            await task
        except asyncio.CancelledError:
            pass
        for _ in range(50):  # the claim lands, then is given back
            await asyncio.sleep(0.02)
            if not consumer._releasing and store.entered.is_set():
                break
        return InMemoryStore.claim(store, "a-1", lease_ms=60_000, now_ms=0)

    assert asyncio.run(scenario()) is ClaimStatus.CLAIMED  # not BUSY for the lease
    assert handled == []

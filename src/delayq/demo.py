"""``delayq demo``: provision a seconds-long ladder, publish mixed delays, watch them arrive.

It shows the two promises that matter most: no message arrives before its
delay, and none waits behind another (a 1 s message published right after a
20 s one arrives after about 2 s, its tier).
"""

from __future__ import annotations

import random
import sys
import time
import uuid
from contextlib import ExitStack

from delayq.errors import ConnectionFailed, InvalidInput
from delayq.local.node import LocalNode, server_installed
from delayq.message.envelope import H_DELAY_MS, H_PUBLISHED_AT, H_TIER, Message
from delayq.sync._connection import close_quietly, connect
from delayq.sync.provision import apply_topology, delete_topology
from delayq.sync.publisher import Publisher
from delayq.topology.model import Topology
from delayq.urls import redact, resolve_url

__all__ = ["run_demo"]

DEMO_LADDER = ["2s", "5s", "10s", "20s"]
DEMO_DELAYS_MS = [0, 1_000, 2_000, 3_000, 5_000, 7_000, 10_000, 12_000, 15_000, 20_000]
DEADLINE_S = 45.0


def _say(text: str = "") -> None:
    print(text, flush=True)


def run_demo(
    url: str | None = None,
    *,
    messages: int = 36,
    local_node: bool = False,
    keep: bool = False,
    seed: int | None = None,
) -> int:
    """Run the demo; returns 0 when every message arrived, never early.

    ``messages`` is at least 2: the demo's point is a short delay published right
    after a long one, and it must not wait behind it.
    """
    if isinstance(messages, bool) or not isinstance(messages, int) or messages < 2:
        raise InvalidInput(
            f"the demo needs at least 2 messages (a 20 s one, then a 1 s one that must "
            f"not wait behind it), got {messages!r}"
        )
    rng = random.Random(seed)
    with ExitStack() as stack:
        if local_node:
            if not server_installed():
                _say(
                    "delayq demo: --local-node needs rabbitmq-server (apt-get install "
                    "rabbitmq-server)"
                )
                return 2
            _say("starting a throwaway RabbitMQ node from the installed server ...")
            node = stack.enter_context(LocalNode())
            url = node.url
        url = resolve_url(url)
        ns = f"demo-{uuid.uuid4().hex[:6]}"
        queue = f"{ns}.inbox"
        topology = Topology.from_mapping(
            {
                "namespace": ns,
                "ladder": DEMO_LADDER,
                "destinations": [{"queue": queue, "bindings": ["demo.#"]}],
            }
        )
        _say(f"broker {redact(url)}; namespace {ns}; ladder {' '.join(DEMO_LADDER)}")
        try:
            report = apply_topology(topology, url)
        except ConnectionFailed as exc:
            hint = " (try --local-node)" if server_installed() and not local_node else ""
            _say(f"delayq demo: {exc}{hint}")
            return 1
        _say(f"topology applied: {report.summary()}")
        if not keep:
            stack.callback(delete_topology, topology, url)

        # The longest delay first, then the shortest: the short one must not wait.
        delays = [20_000, 1_000] + [rng.choice(DEMO_DELAYS_MS) for _ in range(messages - 2)]
        batch = [
            Message({"n": n, "delay_ms": d}, f"demo.msg.{n}", f"{d}ms", message_id=f"{ns}-{n:03d}")
            for n, d in enumerate(delays)
        ]
        with Publisher(url, topology) as publisher:
            receipts = publisher.publish_many(batch)
        by_id = {r.message_id: r for r in receipts}
        _say(f"published {len(receipts)} messages, every one confirmed by the broker\n")
        _say(f"{'message':<16}{'asked':>8}{'tier':>10}{'arrived':>10}{'after due':>11}  ")
        _say("-" * 58)

        connection = connect(url, name="delayq-demo-consumer")
        stack.callback(close_quietly, connection)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)
        arrived: dict[str, float] = {}
        early = 0
        worst_ms = 0.0
        deadline = time.monotonic() + DEADLINE_S
        for method, props, _body in channel.consume(queue, inactivity_timeout=0.5):
            if method is not None:
                receipt = by_id.get(props.message_id)
                now_ms = time.time() * 1000
                if receipt is not None and props.message_id not in arrived:
                    headers = props.headers or {}
                    after_ms = now_ms - int(headers.get(H_PUBLISHED_AT, receipt.published_at_ms))
                    over_ms = after_ms - receipt.tier_ms
                    arrived[props.message_id] = after_ms
                    worst_ms = max(worst_ms, over_ms)
                    early += after_ms < int(headers.get(H_DELAY_MS, receipt.delay_ms))
                    _say(
                        f"{props.message_id:<16}{receipt.delay_ms / 1000:>7.1f}s"
                        f"{headers.get(H_TIER, receipt.tier)!s:>10}"
                        f"{after_ms / 1000:>9.2f}s{over_ms / 1000:>+10.2f}s"
                    )
                channel.basic_ack(method.delivery_tag)
            if len(arrived) == len(receipts) or time.monotonic() > deadline:
                break
        channel.cancel()

    missing = len(receipts) - len(arrived)
    _say("-" * 58)
    _say(
        f"{len(arrived)}/{len(receipts)} arrived; {early} early; latest arrival "
        f"{worst_ms / 1000:.2f}s after its tier's TTL"
    )
    if missing or early:
        _say(
            "delayq demo: FAILED",
        )
        print(f"{missing} missing, {early} early", file=sys.stderr)
        return 1
    return 0

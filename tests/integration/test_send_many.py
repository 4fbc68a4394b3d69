"""Publisher.send_many: a lazy stream through one connection, each message settled once,
never more than the window pulled ahead of the confirms."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from delayq.errors import PublishError, TopologyMissing, UnsendableMessage
from delayq.message.envelope import OutgoingMessage
from delayq.sync import Publisher, apply_topology

from .conftest import Collector


def test_a_stream_is_pulled_lazily_and_each_message_settled_once(
    make_topology: Any, rabbitmq_url: str
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    collector = Collector(rabbitmq_url, [f"{topo.namespace}.work"]).start()
    pulled = 0
    settled: dict[int, PublishError | None] = {}
    ahead: list[int] = []
    window = 50
    try:
        with Publisher(rabbitmq_url, topo) as pub:

            def stream() -> Iterator[OutgoingMessage]:
                nonlocal pulled
                for n in range(3_000):
                    ahead.append(pulled - len(settled))
                    pulled += 1
                    yield pub.factory.build({"n": n}, "job.a", "0s", message_id=f"s{n}")

            def settle(index: int, msg: OutgoingMessage, error: PublishError | None) -> None:
                assert index not in settled
                assert msg.message_id == f"s{index}"
                settled[index] = error

            pub.send_many(stream(), settle=settle, window=window)
        assert pulled == 3_000 and len(settled) == 3_000
        assert all(error is None for error in settled.values())
        assert max(ahead) <= window  # never more than the window unconfirmed
        arrivals = collector.wait(3_000, 30)
        assert sorted(a.message_id for a in arrivals) == sorted(
            f"s{n}" for n in range(3_000)
        )
    finally:
        collector.stop()


def test_a_stream_before_apply_raises_topology_missing(
    make_topology: Any, rabbitmq_url: str
) -> None:
    topo = make_topology(["1s"])
    settled: list[Any] = []
    with Publisher(rabbitmq_url, topo) as pub:
        messages = (pub.factory.build(b"x", "job.a", "1s") for _ in range(10))
        with pytest.raises(TopologyMissing):
            pub.send_many(messages, settle=lambda *args: settled.append(args))
    assert settled == []


def test_a_message_delayq_fails_to_encode_is_settled_alone_and_the_stream_goes_on(
    make_topology: Any, rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the message was taken from the stream and never settled: the settle
    callback never heard of it (publish_many would have given it a receipt)."""
    import delayq.sync._round as round_module

    original = round_module.publish_frames

    def encode(msg: OutgoingMessage, *args: Any) -> bytes | None:
        if msg.message_id == "e5":
            raise RuntimeError("injected: cannot encode e5")
        return original(msg, *args)

    monkeypatch.setattr(round_module, "publish_frames", encode)
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    settled: dict[int, PublishError | None] = {}
    with Publisher(rabbitmq_url, topo) as pub:
        messages = [pub.factory.build(b"x", "job.a", "0s", message_id=f"e{n}") for n in range(20)]

        def settle(index: int, msg: OutgoingMessage, error: PublishError | None) -> None:
            assert index not in settled
            settled[index] = error

        pub.send_many(messages, settle=settle, window=10)
    assert sorted(settled) == list(range(20))
    failed = {index: error for index, error in settled.items() if error is not None}
    assert list(failed) == [5]
    assert isinstance(failed[5], UnsendableMessage) and failed[5].message_id == "e5"
    assert "injected: cannot encode e5" in str(failed[5])

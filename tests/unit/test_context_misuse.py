"""``with`` on an async class, ``async with`` on a sync one, and either on a consumer end
in a clear delayq error saying what to write (issue 48: ``with AsyncPublisher(...)`` used
to raise ``AttributeError: __enter__``). Nothing connects: the URL has no broker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from delayq import InvalidInput, Topology
from delayq.aio import AsyncConsumer, AsyncPublisher
from delayq.sync import Consumer, Publisher

DEAD_URL = "amqp://guest:guest@127.0.0.1:1/"
TOPOLOGY = Topology(namespace="ctx", destinations=[{"queue": "ctx.work", "bindings": ["#"]}])


def _build(cls: type) -> Any:
    if cls in (Publisher, AsyncPublisher):
        return cls(DEAD_URL, TOPOLOGY)
    return cls(DEAD_URL, TOPOLOGY, "ctx.work", lambda body: None)


def _with(thing: Any) -> None:
    with thing:
        raise AssertionError("the body must not run")


async def _async_with(thing: Any) -> None:
    async with thing:
        raise AssertionError("the body must not run")


CASES = [
    (AsyncPublisher, _with, r"AsyncPublisher is an async context manager: write `async with"),
    (Publisher, _async_with, r"Publisher is a sync context manager: write `with Publisher"),
    (Consumer, _with, r"Consumer is not a context manager: call consumer\.run\(\)"),
    (Consumer, _async_with, r"Consumer is not a context manager: call consumer\.run\(\)"),
    (AsyncConsumer, _with, r"AsyncConsumer is not a context manager: .*await consumer\.run\(\)"),
    (AsyncConsumer, _async_with, r"AsyncConsumer is not a context manager: .*await consumer\.run"),
]


@pytest.mark.parametrize(("cls", "use", "says"), CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_the_wrong_with_says_what_to_write(cls: type, use: Any, says: str) -> None:
    thing = _build(cls)

    def run() -> None:
        result = use(thing)
        if asyncio.iscoroutine(result):
            asyncio.run(result)

    with pytest.raises(InvalidInput, match=says):
        run()


def test_the_right_with_still_works() -> None:
    with Publisher(DEAD_URL, TOPOLOGY) as publisher:
        assert isinstance(publisher, Publisher)

    async def main() -> None:
        async with AsyncPublisher(DEAD_URL, TOPOLOGY) as publisher:
            assert isinstance(publisher, AsyncPublisher)

    asyncio.run(main())

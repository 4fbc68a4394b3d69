"""Handlers whose signature cannot take what delayq passes are refused when registered,
and a retry's log line says what failed (issue 48: a handler with no parameters used to
fail every delivery with a TypeError, retried for an hour as "attempt 1 failed")."""

from __future__ import annotations

import functools
import logging
from typing import Any

import pytest

from delayq import FixedBackoff, Topology, Worker
from delayq.aio import AsyncConsumer
from delayq.consume.delivery import Action, Delivery
from delayq.consume.planner import DeliveryPlanner
from delayq.errors import InvalidInput
from delayq.observe.stats import ConsumerStats
from delayq.stores.sqlite import SQLiteStore
from delayq.sync import Consumer

DEAD_URL = "amqp://guest:guest@127.0.0.1:1/"  # nothing listens: building must not connect
TOPOLOGY = Topology(namespace="sig", destinations=[{"queue": "sig.work", "bindings": ["#"]}])


def no_params() -> None: ...


def two_required(body: Any, extra: Any) -> None: ...


def keyword_only(*, body: Any) -> None: ...


def one(body: Any) -> None: ...


def body_and_optional(body: Any, retries: int = 3, *rest: Any, **options: Any) -> None: ...


def star_args(*args: Any) -> None: ...


def tx_handler(body: Any, tx: Any) -> None: ...


async def async_no_params() -> None: ...


async def async_one(body: Any) -> None: ...


class Callable_:
    def __call__(self) -> None: ...


WRONG = [no_params, two_required, keyword_only, Callable_(), functools.partial(one, 1)]
RIGHT = [one, body_and_optional, star_args, functools.partial(two_required, extra=2), print]


def _register(where: str, handler: Any, **options: Any) -> None:
    if where == "Consumer":
        Consumer(DEAD_URL, TOPOLOGY, "sig.work", handler, **options)
    elif where == "AsyncConsumer":
        AsyncConsumer(DEAD_URL, TOPOLOGY, "sig.work", handler, **options)
    else:
        Worker(TOPOLOGY).handler("sig.work", **options)(handler)


@pytest.mark.parametrize("where", ["Consumer", "AsyncConsumer", "Worker"])
@pytest.mark.parametrize("handler", WRONG, ids=lambda h: getattr(h, "__name__", type(h).__name__))
def test_a_handler_that_cannot_take_the_body_is_refused(where: str, handler: Any) -> None:
    with pytest.raises(InvalidInput, match=r"cannot be called as handler\(body\)") as caught:
        _register(where, handler)
    name = getattr(handler, "__qualname__", None) or repr(handler)
    assert name in str(caught.value)


@pytest.mark.parametrize("where", ["AsyncConsumer", "Worker"])
def test_an_async_handler_without_parameters_is_refused(where: str) -> None:
    with pytest.raises(InvalidInput, match=r"async_no_params\(\) cannot be called as handler"):
        _register(where, async_no_params)
    _register(where, async_one)


@pytest.mark.parametrize("where", ["Consumer", "AsyncConsumer", "Worker"])
@pytest.mark.parametrize("handler", RIGHT, ids=lambda h: getattr(h, "__name__", type(h).__name__))
def test_handlers_that_take_the_body_are_accepted(where: str, handler: Any) -> None:
    _register(where, handler)


@pytest.mark.parametrize("where", ["Consumer", "AsyncConsumer", "Worker"])
def test_a_transactional_handler_must_take_body_and_tx(where: str, tmp_path: Any) -> None:
    store = SQLiteStore(str(tmp_path / "keys.db"))
    options = {"transactional": True, "store": store, "check_retention": False}
    with pytest.raises(InvalidInput, match=r"one\(body\) cannot be called as handler\(body, tx\)"):
        _register(where, one, **options)
    _register(where, tx_handler, **options)


def test_the_retry_reason_and_log_line_name_the_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    planner = DeliveryPlanner(TOPOLOGY, "sig.work", policy=FixedBackoff("1m"))
    delivery = Delivery("sig.work", b"{}", "k", "m-1", "application/json", {})
    try:
        no_params(1)  # type: ignore[call-arg]
    except TypeError as exc:
        decision = planner.failure(delivery, exc)
    assert decision.action is Action.RETRY
    assert decision.reason == (
        "attempt 1 failed: TypeError: no_params() takes 0 positional arguments but 1 was given"
    )
    with caplog.at_level(logging.INFO, logger="delayq.consumer"):
        ConsumerStats().record(decision)
    assert "retrying m-1 (attempt 1 failed: TypeError: no_params() takes 0" in caplog.text

"""Log lines logged while a delivery is handled carry its message id, queue, routing key
and attempt, in text and in JSON; lines outside a delivery carry none."""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from delayq.consume.delivery import Delivery
from delayq.errors import InvalidInput
from delayq.message.envelope import envelope_headers
from delayq.observe.logs import (
    DeliveryLogFilter,
    JsonLogFormatter,
    TextLogFormatter,
    bound_delivery,
    configure_logging,
    current_delivery,
)


def delivery(message_id: str = "m-1", attempt: int = 3) -> Delivery:
    headers = envelope_headers(0, None, 0, 1_000, attempt, "orders.created")
    # The routing key seen here is the retry hop's; the original one travels in a header.
    return Delivery("app.work", b"{}", "app.work", message_id, "application/json", headers)


@pytest.fixture
def stream() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(DeliveryLogFilter())
    logger = logging.getLogger("test.logcontext")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, out, handler
    logger.removeHandler(handler)


def test_a_json_line_logged_inside_a_delivery_parses_with_its_fields(stream) -> None:
    logger, out, handler = stream
    handler.setFormatter(JsonLogFormatter())
    with bound_delivery(delivery()):
        logger.info("charging %s", "card")
    logger.warning("between deliveries")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["message"] == "charging card" and first["level"] == "INFO"
    assert first["logger"] == "test.logcontext" and first["ts"].endswith("+00:00")
    assert (first["message_id"], first["queue"], first["routing_key"], first["attempt"]) == (
        "m-1",
        "app.work",
        "orders.created",
        3,
    )
    assert second["message"] == "between deliveries"
    assert not {"message_id", "queue", "routing_key", "attempt"} & second.keys()


def test_a_json_line_keeps_the_traceback(stream) -> None:
    logger, out, handler = stream
    handler.setFormatter(JsonLogFormatter())
    with bound_delivery(delivery()):
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("handler failed")
    [entry] = [json.loads(line) for line in out.getvalue().splitlines()]
    assert "ValueError: boom" in entry["exc"] and entry["message_id"] == "m-1"


def test_text_lines_append_the_fields_after_the_first_line(stream) -> None:
    logger, out, handler = stream
    handler.setFormatter(TextLogFormatter("%(levelname)s %(message)s"))
    with bound_delivery(delivery()):
        try:
            raise KeyError("k")
        except KeyError:
            logger.exception("failed")
    logger.info("idle")
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        "ERROR failed message_id=m-1 queue=app.work routing_key=orders.created attempt=3"
    )
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "INFO idle"


def test_the_binding_ends_with_the_block_and_nests() -> None:
    assert current_delivery() is None
    with bound_delivery(delivery("outer")):
        with bound_delivery(delivery("inner")):
            assert current_delivery().message_id == "inner"  # type: ignore[union-attr]
        assert current_delivery().message_id == "outer"  # type: ignore[union-attr]
    assert current_delivery() is None


def test_threads_and_tasks_started_inside_see_the_delivery() -> None:
    seen: list[str | None] = []

    def in_thread() -> None:
        context = current_delivery()
        seen.append(None if context is None else context.message_id)

    async def concurrent_deliveries() -> None:
        async def handle(message_id: str) -> None:
            with bound_delivery(delivery(message_id)):
                await asyncio.sleep(0.01)  # the other task runs meanwhile
                await asyncio.to_thread(in_thread)

        await asyncio.gather(handle("a"), handle("b"))

    with bound_delivery(delivery("t")):
        thread = threading.Thread(target=contextvars.copy_context().run, args=(in_thread,))
        thread.start()
        thread.join()
    asyncio.run(concurrent_deliveries())
    assert seen == ["t", "a", "b"]


def test_configure_logging_installs_one_handler_with_the_filter() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        handler = configure_logging("warning", "json")
        assert root.handlers == [handler] and root.level == logging.WARNING
        assert isinstance(handler.formatter, JsonLogFormatter)
        assert any(isinstance(f, DeliveryLogFilter) for f in handler.filters)
        with pytest.raises(InvalidInput, match="log format"):
            configure_logging("info", "xml")  # type: ignore[arg-type]
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])

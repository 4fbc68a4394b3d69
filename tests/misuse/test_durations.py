"""Durations without a unit, and retry policies longer than the ladder (issue 12, items 9, 13).

Every public constructor, function and CLI flag that takes a duration refuses a
bare number (int, float, bool, or a numeric string) with a delayq error naming
the parameter and saying how to write it, and accepts ``"1s"`` and a
``timedelta``. On 0.1 ``ExponentialBackoff(initial=1)`` was silently 1 ms.

A retry policy whose delays the ladder (or the exact cascade) cannot hold is
refused when a consumer or a worker is declared; ``retry-plan`` shows the plan
up to that retry and warns. On 0.1 such a retry was dead-lettered as
``delay-too-long`` at run time.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from delayq import (
    DEFAULT_LADDER,
    ExponentialBackoff,
    FixedBackoff,
    InvalidInput,
    Ladder,
    Message,
    Retry,
    ScheduleBackoff,
    Settled,
    Topology,
    Worker,
)
from delayq.aio import AsyncConsumer, AsyncPublisher
from delayq.cli import main
from delayq.durations import to_ms
from delayq.errors import InvalidDelay
from delayq.message.bulk import BulkPlanner, Rejection, Row
from delayq.sync import Consumer, Publisher
from delayq.testing import MemoryBroker
from tests.waiting import wait_for

DEAD_URL = "amqp://guest:x@127.0.0.1:1/"  # constructors do not connect
TOPOLOGY = Topology(
    namespace="dur",
    ladder=["1s", "1m", "1h"],
    destinations=[{"queue": "work", "bindings": ["job.#"]}],
)


class CliRefused(Exception):
    """``delayq`` exited 2 (bad input); the message is what it printed."""


class Reached(Exception):
    """A stub past the duration's parsing was reached: the duration was accepted."""


@dataclass(frozen=True)
class Env:
    broker: MemoryBroker
    yaml_file: str
    records: str
    """A folder that exists: spark report checks its input before Spark starts."""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    path = tmp_path_factory.mktemp("durations") / "topology.yaml"
    path.write_text(yaml.safe_dump(TOPOLOGY.model_dump(mode="json")))
    records = path.parent / "records"
    records.mkdir()
    broker = MemoryBroker()
    broker.apply(TOPOLOGY)
    yield Env(broker, str(path), str(records))
    broker.close()


def cli(*argv: str) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(list(argv))
    if code == 2:
        raise CliRefused(err.getvalue())
    assert code == 0, err.getvalue()


def bulk(value: object) -> None:
    planned = BulkPlanner(TOPOLOGY).plan(Row("k", "job.x", delay=value))
    if isinstance(planned, Rejection):
        raise InvalidDelay(f"{planned.error}: {planned.reason}")


def handler(body: Any) -> None:
    pass


# name: (how to call it with the duration, words its refusal must contain)
Call = Callable[[Env, Any], object]
API: dict[str, tuple[Call, str]] = {
    "to_ms": (lambda e, v: to_ms(v), "delay"),
    "Publisher.publish delay": (
        lambda e, v: Publisher(e.broker.url, TOPOLOGY).publish(b"x", "job.x", v),
        "delay",
    ),
    "Publisher.publish_many Message.delay": (
        lambda e, v: Publisher(e.broker.url, TOPOLOGY).publish_many([Message(b"x", "job.x", v)]),
        "message 0: delay",
    ),
    "AsyncPublisher.publish delay": (
        lambda e, v: asyncio.run(AsyncPublisher(e.broker.url, TOPOLOGY).publish(b"x", "job.x", v)),
        "delay",
    ),
    "Retry": (lambda e, v: Retry(v), "delay"),
    "ExponentialBackoff initial": (lambda e, v: ExponentialBackoff(initial=v), "initial"),
    "ExponentialBackoff max_delay": (
        lambda e, v: ExponentialBackoff(initial="1s", max_delay=v),
        "max_delay",
    ),
    "FixedBackoff delay": (lambda e, v: FixedBackoff(delay=v), "delay"),
    "ScheduleBackoff delays": (lambda e, v: ScheduleBackoff(delays=[v]), "delays[0]"),
    "ScheduleBackoff.of": (lambda e, v: ScheduleBackoff.of(["1s", v]), "delays[1]"),
    "Consumer handler_timeout": (
        lambda e, v: Consumer(DEAD_URL, TOPOLOGY, "work", handler, handler_timeout=v),
        "handler_timeout",
    ),
    "Consumer lease": (
        lambda e, v: Consumer(
            DEAD_URL, TOPOLOGY, "work", handler, handler_timeout="500ms", lease=v
        ),
        "lease",
    ),
    "Consumer retention": (
        lambda e, v: Consumer(
            DEAD_URL,
            TOPOLOGY,
            "work",
            handler,
            handler_timeout="200ms",
            lease="500ms",
            retention=v,
        ),
        "retention",
    ),
    "AsyncConsumer handler_timeout": (
        lambda e, v: AsyncConsumer(DEAD_URL, TOPOLOGY, "work", handler, handler_timeout=v),
        "handler_timeout",
    ),
    "AsyncConsumer lease": (
        lambda e, v: AsyncConsumer(
            DEAD_URL, TOPOLOGY, "work", handler, handler_timeout="500ms", lease=v
        ),
        "lease",
    ),
    "AsyncConsumer retention": (
        lambda e, v: AsyncConsumer(
            DEAD_URL,
            TOPOLOGY,
            "work",
            handler,
            handler_timeout="200ms",
            lease="500ms",
            retention=v,
        ),
        "retention",
    ),
    "memory Consumer handler_timeout": (
        lambda e, v: Consumer(e.broker.url, TOPOLOGY, "work", handler, handler_timeout=v),
        "handler_timeout",
    ),
    "Worker defaults handler_timeout": (
        lambda e, v: Worker(TOPOLOGY, handler_timeout=v),
        "handler_timeout",
    ),
    "Worker.handler lease": (
        lambda e, v: Worker(TOPOLOGY, handler_timeout="500ms").handler("work", lease=v)(handler),
        "lease",
    ),
    "Topology ladder": (
        lambda e, v: Topology.from_mapping({"ladder": ["1m", v]}),
        "tier",
    ),
    "Topology exact.unit": (
        lambda e, v: Topology.from_mapping({"ladder": ["1s", "1m"], "exact": {"unit": v}}),
        "exact.unit",
    ),
    "Ladder.parse": (lambda e, v: Ladder.parse(["1m", v]), "tier"),
    "Ladder.select": (lambda e, v: DEFAULT_LADDER.select(v), "delay"),
    "MemoryBroker.advance": (lambda e, v: e.broker.advance(v), "advance"),
    "MemoryBroker.advance_async": (lambda e, v: asyncio.run(e.broker.advance_async(v)), "advance"),
    "MemoryBroker.run_until_idle max": (lambda e, v: e.broker.run_until_idle(max=v), "max"),
    "MemoryBroker.run_until max": (lambda e, v: e.broker.run_until(lambda: True, max=v), "max"),
    "bulk Row delay": (lambda e, v: bulk(v), "delay"),
}

CLI: dict[str, tuple[Call, str]] = {
    "publish --delay": (
        lambda e, v: cli(
            "publish", "-f", e.yaml_file, "--url", e.broker.url, "-k", "job.x", f"--delay={v}"
        ),
        "delay",
    ),
    "retry-plan --initial": (
        lambda e, v: cli("retry-plan", "-f", e.yaml_file, f"--initial={v}", "--max-delay=1m"),
        "initial",
    ),
    "retry-plan --max-delay": (
        lambda e, v: cli("retry-plan", "-f", e.yaml_file, "--initial=1s", f"--max-delay={v}"),
        "max_delay",
    ),
    "retry-plan --delay": (
        lambda e, v: cli("retry-plan", "-f", e.yaml_file, "--policy=fixed", f"--delay={v}"),
        "delay",
    ),
    "retry-plan --delays": (
        lambda e, v: cli("retry-plan", "-f", e.yaml_file, "--policy=schedule", f"--delays=1s {v}"),
        "delays[1]",
    ),
    "topology verify --probe-timeout": (
        lambda e, v: cli(
            "topology",
            "verify",
            "-f",
            e.yaml_file,
            "--url",
            DEAD_URL,
            "--no-management",
            f"--probe-timeout={v}",
        ),
        "--probe-timeout",
    ),
    "spark report --bucket": (
        lambda e, v: cli(
            "spark", "report", e.records, "--out", f"{e.records}-out", f"--bucket={v}"
        ),
        "--bucket",
    ),
    "spark report --ladder": (
        lambda e, v: cli(
            "spark", "report", e.records, "--out", f"{e.records}-out", f"--ladder=1m {v}"
        ),
        "tier",
    ),
}

BARE_NUMBERS = st.one_of(
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.integers(0, 10**9).map(str),
    st.integers(0, 10**9).map(lambda n: f" {n} "),
)
# What a shell passes: text. Negative numbers and exponents included.
BARE_TEXT = st.one_of(
    st.integers(-(10**9), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


@contextlib.contextmanager
def past_parsing() -> Iterator[None]:
    """Stub what the CLI does after it parsed its durations (a broker, a Spark session)."""

    def reached(*args: Any, **kwargs: Any) -> Any:
        raise Reached

    with (
        mock.patch("delayq.sync.verify.verify_topology", reached),
        mock.patch("delayq.cli.spark._spark_session", reached),
    ):
        yield


@pytest.mark.parametrize("name", sorted(API))
@settings(max_examples=25, deadline=None)
@given(value=BARE_NUMBERS)
def test_every_duration_parameter_refuses_a_bare_number(env, name, value):
    call, words = API[name]
    with pytest.raises(InvalidInput) as caught:
        call(env, value)
    message = str(caught.value)
    assert words in message, message
    assert "timedelta" in message, message  # says how to write it


@pytest.mark.parametrize("name", sorted(CLI))
@settings(max_examples=15, deadline=None)
@given(value=BARE_TEXT)
def test_every_cli_duration_flag_refuses_a_bare_number(env, name, value):
    call, words = CLI[name]
    with pytest.raises(CliRefused) as caught:
        call(env, value)
    assert words in str(caught.value), str(caught.value)


@pytest.mark.parametrize("value", ["1s", timedelta(seconds=1)], ids=["str", "timedelta"])
@pytest.mark.parametrize("name", sorted(API))
def test_every_duration_parameter_accepts_a_string_or_a_timedelta(env, name, value):
    call, _ = API[name]
    call(env, value)


@pytest.mark.parametrize("name", sorted(CLI))
def test_every_cli_duration_flag_accepts_a_duration(env, name):
    call, _ = CLI[name]
    with past_parsing(), contextlib.suppress(Reached):
        call(env, "1s")


def test_a_bare_number_in_a_topology_file_is_refused_naming_the_field(tmp_path):
    from delayq import load_topology
    from delayq.errors import InvalidTopology

    path = tmp_path / "t.yaml"
    path.write_text("ladder: [1s, 1m]\nexact:\n  unit: 250\n")
    with pytest.raises(InvalidTopology, match=r"exact\.unit: .*250 is a bare number"):
        load_topology(path)


# --- retry policies the ladder cannot hold ----------------------------------------------------

SHORT = Topology(
    namespace="short",
    ladder=["1s", "2s"],
    destinations=[{"queue": "work", "bindings": ["job.#"]}],
)
TOO_LONG = ExponentialBackoff(initial="1s", max_delay="5s", max_attempts=4)  # 1s 2s 4s


@pytest.mark.parametrize(
    "declare",
    [
        lambda p: Consumer(DEAD_URL, SHORT, "work", handler, policy=p),
        lambda p: AsyncConsumer(DEAD_URL, SHORT, "work", handler, policy=p),
        lambda p: Worker(SHORT, policy=p),
        lambda p: Worker(SHORT).handler("work", policy=p)(handler),
    ],
    ids=["Consumer", "AsyncConsumer", "Worker-defaults", "Worker.handler"],
)
def test_a_policy_longer_than_the_ladder_is_refused_when_declared(declare):
    with pytest.raises(InvalidInput) as caught:
        declare(TOO_LONG)
    message = str(caught.value)
    assert "retry 3 (before attempt 4) asks for 4s, longer than the largest tier 2s" in message
    assert 'max_delay="2s"' in message and "add a tier of at least 4s" in message


def test_a_policy_that_exactly_fits_and_one_that_stops_in_time_are_accepted():
    Consumer(
        DEAD_URL, SHORT, "work", handler, policy=ExponentialBackoff(initial="1s", max_delay="2s")
    )
    # 5s is never asked for: attempts run out after the 2s retry.
    Consumer(DEAD_URL, SHORT, "work", handler, policy=ScheduleBackoff.of(["1s", "2s"]))
    Consumer(
        DEAD_URL,
        SHORT,
        "work",
        handler,
        policy=ExponentialBackoff(initial="1s", max_delay="5s", max_attempts=3),
    )


def test_the_exact_strategys_maximum_is_the_limit_there():
    exact = Topology(
        namespace="ex",
        ladder=["1s", "2s"],
        strategy="exact",
        exact={"unit": "250ms", "levels": 3},  # at most 7 units: 1750ms
        destinations=[{"queue": "work", "bindings": ["job.#"]}],
    )
    with pytest.raises(InvalidInput, match=r"the exact strategy's maximum 1s750ms.*exact\.levels"):
        Consumer(DEAD_URL, exact, "work", handler, policy=FixedBackoff(delay="2s"))
    Consumer(DEAD_URL, exact, "work", handler, policy=FixedBackoff(delay="1750ms"))


def test_a_memory_consumer_refuses_it_too():
    with MemoryBroker() as broker:
        with pytest.raises(InvalidInput, match="largest tier 2s"):
            Consumer(broker.url, SHORT, "work", handler, policy=TOO_LONG)


def test_a_policy_class_instead_of_an_instance_is_refused():
    with pytest.raises(InvalidInput, match="policy must be a retry policy"):
        Consumer(DEAD_URL, SHORT, "work", handler, policy=ExponentialBackoff)  # type: ignore[arg-type]


def test_retry_plan_shows_the_plan_up_to_the_retry_too_long_and_warns(tmp_path, capsys):
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(SHORT.model_dump(mode="json")))
    code = main(
        ["retry-plan", "-f", str(path), "--initial=1s", "--max-delay=5s", "--max-attempts=4"]
    )
    out, err = capsys.readouterr()
    assert code == 2
    rows = [line.split() for line in out.splitlines()]
    assert rows[rows.index(["3", "2s", "2s", "0s", "3s"]) + 1] == ["4", "4s", "too", "long"]
    assert "# then the dead-letter queue (delay-too-long), after 3 attempts" in out
    assert "warning: retry policy: retry 3 (before attempt 4) asks for 4s" in err
    assert "a Consumer or Worker refuses it" in err


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_consumer_with_no_policy_on_a_short_ladder_retries_instead_of_dead_lettering(
    kind, make_topology, rabbitmq_url
):
    """The default policy (30 s doubling to 1 h) is capped at the ladder: on a 1 s - 2 s
    test ladder a failure is retried after 2 s. On 0.1 it went to the DLQ as
    delay-too-long."""
    from delayq.sync import apply_topology
    from tests.integration.conftest import AsyncConsumerHandle, SyncConsumerHandle

    topology = make_topology(["1s", "2s"])
    queue = topology.destinations[0].queue
    apply_topology(topology, rabbitmq_url)
    calls: list[int] = []
    outcomes: list[str] = []
    lock = threading.Lock()

    class Watch:
        def settled(self, event: Settled) -> None:
            with lock:
                outcomes.append(event.outcome)

    def flaky(body: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first attempt fails")

    async def flaky_async(body: Any) -> None:
        flaky(body)

    if kind == "sync":
        handle: Any = SyncConsumerHandle(
            Consumer(rabbitmq_url, topology, queue, flaky, observers=[Watch()])
        )
    else:
        handle = AsyncConsumerHandle(
            AsyncConsumer(rabbitmq_url, topology, queue, flaky_async, observers=[Watch()])
        )
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            publisher.publish({"n": 1}, "job.x", "0s")
        wait_for(lambda: len(outcomes) >= 2, 30, lambda: f"a retry and an ack: {outcomes}")
    finally:
        handle.stop(10)
    assert outcomes == ["retry", "ack"]
    assert len(calls) == 2


def test_a_policy_given_as_a_number_of_attempts_only_still_fits(tmp_path: Path):
    """ExponentialBackoff(max_attempts=8) on the default ladder: 30s .. 1h, all held."""
    Consumer(
        DEAD_URL,
        Topology(destinations=[{"queue": "w", "bindings": ["a"]}]),
        "w",
        handler,
        policy=ExponentialBackoff(max_attempts=8),
    )

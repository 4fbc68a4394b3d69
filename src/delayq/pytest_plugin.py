"""pytest fixtures that find a real RabbitMQ broker (loaded as the ``delayq`` plugin).

``rabbitmq_url`` looks, in order, for:

1. ``RABBITMQ_URL`` in the environment;
2. a testcontainers RabbitMQ, when a Docker engine answers;
3. a local node started from the installed ``rabbitmq-server`` (see
   :mod:`delayq.local.node`), stopped at the end of the session.

``local_rabbitmq_node`` and ``local_rabbitmq_management_node`` are local nodes
the session controls (users, restarts, rabbitmqctl), the second with the
management plugin enabled. ``local_rabbitmq_cluster`` starts three local nodes
joined into one cluster (:mod:`delayq.local.cluster`) for one test, and stops
them after it.

With none of them, the fixture fails when ``CI`` is set (a missing broker must
never pass as a skip there) and skips otherwise, saying how to get one. An installed
server whose node does not start fails the test, ``CI`` or not.

The URL it gives is a ``str`` whose ``repr`` hides the password, so an
assertion that shows it, or ``--showlocals``, does not print the password.

``redis_url`` and ``postgres_dsn`` (for the Redis and PostgreSQL idempotency stores)
follow the same rule: ``REDIS_URL`` / ``POSTGRES_DSN`` from the environment, else a
throwaway server started from the installed ``redis-server`` / ``postgresql``
package (see :mod:`delayq.local.servers`) and stopped at the end of the session.

``rabbitmq_version`` is the version the broker of ``rabbitmq_url`` reports, as a tuple of
ints (``(4, 0, 5)``), for tests that assert what their version does.

Which server a local node runs (see :mod:`delayq.local.rabbitmq`) follows
``$DELAYQ_RABBITMQ_SERVER`` (``installed``, the default, or ``4.0``); the test run's
header names it. The Docker fallback runs ``$DELAYQ_RABBITMQ_IMAGE``, default
:data:`DOCKER_IMAGE` (the 4.0 line the local tests run).

``memory_broker`` needs no broker at all: a fresh :class:`delayq.testing.MemoryBroker`
(virtual clock, RabbitMQ's routing/TTL/dead-letter semantics) for each test; give its
``url`` to publishers and consumers and move time with ``memory_broker.advance("15m")``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from delayq.local.cluster import LocalCluster
from delayq.local.node import LocalNode, LocalNodeError, server_installed
from delayq.local.probes import epmd_answers, stop_epmd
from delayq.local.rabbitmq import rabbit_server
from delayq.local.servers import LocalPostgres, LocalRedis, LocalServerError
from delayq.testing import MemoryBroker
from delayq.urls import redact

__all__ = [
    "local_rabbitmq_cluster",
    "local_rabbitmq_management_node",
    "local_rabbitmq_node",
    "memory_broker",
    "postgres_dsn",
    "rabbitmq_url",
    "rabbitmq_version",
    "redis_url",
]

DOCKER_IMAGE = "rabbitmq:4.3-management"
"""The image the testcontainers fallback runs (``$DELAYQ_RABBITMQ_IMAGE`` overrides)."""

NO_BROKER = (
    "no RabbitMQ broker: set RABBITMQ_URL, start a Docker engine (testcontainers), or "
    "install the server (apt-get install rabbitmq-server) so a local node can be started"
)


NO_REDIS = (
    "no Redis server: set REDIS_URL, or install the server (apt-get install redis-server) "
    "so a local one can be started"
)
NO_POSTGRES = (
    "no PostgreSQL server: set POSTGRES_DSN, or install the server (apt-get install "
    "postgresql) so a local one can be started"
)


class _RedactedURL(str):
    """The URL itself (``str()``, connecting), with the password hidden in its ``repr``,
    which pytest uses to explain a failed assertion."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(redact(str(self)))


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _no_broker(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"{NO_BROKER} ({reason})", pytrace=False)
    pytest.skip(f"{NO_BROKER} ({reason})")


def _did_not_start(exc: LocalNodeError) -> None:
    """An installed server whose node did not start: a failure, in CI or not (a skip
    would hide it; the server is there, so nothing is missing)."""
    pytest.fail(f"a local RabbitMQ node did not start: {exc}", pytrace=False)


def _missing() -> str:
    """What is missing for the local server this run asked for."""
    try:
        return rabbit_server().missing()
    except ValueError as exc:
        return str(exc)


def _docker_answers() -> bool:
    try:
        docker: Any = importlib.import_module("docker")
        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:
        return False


class _Nodes:
    """Local nodes started in this session, stopped (and epmd with them) at its end."""

    def __init__(self) -> None:
        self.nodes: list[LocalNode] = []
        self.epmd_was_running = epmd_answers()

    def start(self, **kwargs: object) -> LocalNode:
        node = LocalNode(**kwargs)  # type: ignore[arg-type]
        self.nodes.append(node)
        return node.start()

    def close(self) -> None:
        for node in self.nodes:
            node.cleanup()
        if self.nodes and not self.epmd_was_running:
            stop_epmd()


@pytest.fixture(scope="session")
def _delayq_nodes() -> Iterator[_Nodes]:
    nodes = _Nodes()
    yield nodes
    nodes.close()


@pytest.fixture(scope="session")
def local_rabbitmq_node(_delayq_nodes: _Nodes) -> LocalNode:
    """A local node this session controls (stop, restart, rabbitmqctl)."""
    if not server_installed():
        _no_broker(f"{_missing()}; this test needs a node it controls")
    try:
        return _delayq_nodes.start()
    except LocalNodeError as exc:
        _did_not_start(exc)
        raise


@pytest.fixture(scope="session")
def local_rabbitmq_management_node(_delayq_nodes: _Nodes) -> LocalNode:
    """A local node this session controls, running the management plugin.

    Its statistics are sampled every 500 ms (instead of 5 s), so figures read
    from the HTTP API (``node.management_url``) follow the queues closely.
    """
    if not server_installed():
        _no_broker(f"{_missing()}; this test needs a node it controls")
    try:
        return _delayq_nodes.start(management=True, config={"collect_statistics_interval": "500"})
    except LocalNodeError as exc:
        _did_not_start(exc)
        raise


@pytest.fixture
def local_rabbitmq_cluster() -> Iterator[LocalCluster]:
    """Three local nodes joined into one cluster, each with the management API, for this
    test only (then stopped)."""
    if not server_installed():
        _no_broker(f"{_missing()}; this test needs a local cluster")
    cluster = LocalCluster(3, management=True)
    try:
        cluster.start()
    except LocalNodeError as exc:
        _did_not_start(exc)
        raise
    try:
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture(scope="session")
def rabbitmq_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The AMQP URL of a real broker for this test session."""
    url = os.environ.get("RABBITMQ_URL")
    if url:
        yield _RedactedURL(url)
        return
    if _docker_answers():
        from testcontainers.rabbitmq import RabbitMqContainer

        image = os.environ.get("DELAYQ_RABBITMQ_IMAGE") or DOCKER_IMAGE
        with RabbitMqContainer(image) as container:
            params = container.get_connection_params()
            yield _RedactedURL(
                f"amqp://{params.credentials.username}:{params.credentials.password}"
                f"@{params.host}:{params.port}/"
            )
        return
    node: LocalNode = request.getfixturevalue("local_rabbitmq_node")
    yield _RedactedURL(node.url)


@pytest.fixture(scope="session")
def rabbitmq_version(rabbitmq_url: str) -> tuple[int, ...]:
    """The version of the broker at ``rabbitmq_url`` (from the server properties it sends
    when a connection opens), e.g. ``(3, 10, 8)`` or ``(4, 0, 5)``."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(str(rabbitmq_url)))
    try:
        raw = connection._impl.server_properties.get("version", b"")
    finally:
        connection.close()
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    numbers = tuple(int(part) for part in text.split(".") if part.isdigit())
    if not numbers:
        pytest.fail(f"the broker reports no version ({text!r})", pytrace=False)
    return numbers


def pytest_report_header(config: pytest.Config) -> str:
    """Which broker the run uses, in the run's header."""
    if os.environ.get("RABBITMQ_URL"):
        return "delayq: RabbitMQ from $RABBITMQ_URL"
    try:
        server = rabbit_server()
    except ValueError as exc:
        return f"delayq: {exc}"
    version = server.version or "not installed"
    return f"delayq: local RabbitMQ nodes run the {server.name!r} server ({version})"


def _no_server(what: str, reason: str) -> None:
    if _in_ci():
        pytest.fail(f"{what} ({reason})", pytrace=False)
    pytest.skip(f"{what} ({reason})")


def _local_server(
    env: str, make: Callable[[], LocalRedis | LocalPostgres], missing: str
) -> Iterator[str]:
    """``$env`` if set, else a throwaway local server (stopped afterwards)."""
    address = os.environ.get(env)
    if address:
        yield address
        return
    server: LocalRedis | LocalPostgres | None = None
    try:
        server = make()
        server.start()
    except LocalServerError as exc:
        if server is not None:
            server.cleanup()
        _no_server(missing, str(exc))
        raise
    try:
        yield server.url if isinstance(server, LocalRedis) else server.dsn
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of a real Redis server for this test session."""
    yield from _local_server("REDIS_URL", LocalRedis, NO_REDIS)


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """The DSN of a real PostgreSQL server for this test session."""
    yield from _local_server("POSTGRES_DSN", LocalPostgres, NO_POSTGRES)


@pytest.fixture
def memory_broker() -> Iterator[MemoryBroker]:
    """A fresh in-memory broker with a virtual clock for one test (see :mod:`delayq.testing`).

    Consumers still attached at the end of the test are detached; the broker's
    ``memory://`` URL stops resolving.
    """
    broker = MemoryBroker()
    try:
        yield broker
    finally:
        broker.close()

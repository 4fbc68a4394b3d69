"""The Redis and PostgreSQL stores of the ``*_servers`` suites: their fixtures, and the
unit contract cases those suites run again against both servers.

A suite imports the fixtures it uses into its own namespace (pytest finds them there)
and collects a unit module's cases with :func:`contract_cases`. The servers come from
the ``redis_url`` and ``postgres_dsn`` fixtures (environment, else throwaway local
servers).
"""

from __future__ import annotations

import importlib
import inspect
import uuid
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from delayq.pytest_plugin import _in_ci

__all__ = [
    "client_module",
    "contract_cases",
    "opener",
    "postgres_store",
    "redis_client",
    "redis_store",
    "store",
]


def contract_cases(module: ModuleType, *fixtures: str) -> dict[str, Callable[..., Any]]:
    """``module``'s test functions that take any of ``fixtures``: a suite puts them in its
    globals to run them on its own fixtures."""
    return {
        name: case
        for name, case in vars(module).items()
        if name.startswith("test_") and set(fixtures) & set(inspect.signature(case).parameters)
    }


def client_module(name: str, extra: str) -> ModuleType:
    """The client library ``name`` (of ``delayq[extra]``): a skip where it is missing, a
    failure in CI."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        message = f"{exc} (pip install 'delayq[{extra}]')"
        if _in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[Any]:
    redis = client_module("redis", "redis")
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def redis_store(redis_url: str, redis_client: Any) -> Iterator[Callable[..., Any]]:
    """Make RedisStores under fresh prefixes; their keys are deleted afterwards."""
    module = client_module("delayq.stores.redis", "redis")
    _glob_escape = module._glob_escape
    made: list[Any] = []

    def make(**kwargs: Any) -> Any:
        kwargs.setdefault("prefix", f"delayq:test:{uuid.uuid4().hex[:12]}:")
        made.append(module.RedisStore(redis_url, **kwargs))
        return made[-1]

    yield make
    for store in made:
        store.close()
        for name in redis_client.scan_iter(match=_glob_escape(store.prefix) + "*"):
            redis_client.delete(name)


@pytest.fixture
def postgres_store(postgres_dsn: str) -> Iterator[Callable[..., Any]]:
    """Make PostgresStores on fresh tables; the tables are dropped afterwards."""
    module = client_module("delayq.stores.postgres", "postgres")
    made: list[Any] = []

    def make(**kwargs: Any) -> Any:
        kwargs.setdefault("table", f"delayq_test_{uuid.uuid4().hex[:12]}")
        made.append(module.PostgresStore(kwargs.pop("dsn", postgres_dsn), **kwargs))
        return made[-1]

    yield make
    psycopg = client_module("psycopg", "postgres")
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for store in made:
            store.close()
            conn.execute(f"DROP TABLE IF EXISTS {store.table}")


@pytest.fixture(params=["redis", "postgres"])
def opener(request: pytest.FixtureRequest) -> Callable[[], Any]:
    """Opens clients of one store: the same Redis prefix, the same table."""
    factory: Callable[..., Any] = request.getfixturevalue(f"{request.param}_store")
    first = factory()
    place = {"prefix": first.prefix} if request.param == "redis" else {"table": first.table}
    made = [first]

    def open_store() -> Any:
        if made:
            return made.pop()
        return factory(**place)

    return open_store


@pytest.fixture
def store(opener: Callable[[], Any]) -> Any:
    """The first client ``opener`` opens (the contract cases' ``store``)."""
    return opener()

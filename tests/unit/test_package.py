"""The package surface: exports, the exception tree, no broker client in the core."""

from __future__ import annotations

import importlib.metadata
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import delayq
import delayq.errors
from delayq.urls import redact

CORE_PACKAGES = ["topology", "message", "consume", "stores", "observe", "ops", "testing"]
"""The core: every module of these packages is pure (no broker client), as are these top-level
modules. The adapters live in ``delayq.sync`` (pika) and ``delayq.aio`` (aio-pika)."""
CORE_TOP_LEVEL = [
    "delayq",
    "delayq.durations",
    "delayq.urls",
    "delayq.tls",
    "delayq.errors",
    "delayq.scrub",
    "delayq.wording",
    "delayq.links",
]


def _core_modules() -> list[str]:
    found = list(CORE_TOP_LEVEL)
    for package in CORE_PACKAGES:
        path = Path(delayq.__file__).parent / package
        found.append(f"delayq.{package}")
        found += [
            f"delayq.{package}.{m.stem}" for m in sorted(path.glob("*.py")) if m.stem != "__init__"
        ]
    return found


CORE_MODULES = _core_modules()
BROKER_CLIENTS = {"pika", "aio_pika", "aiormq"}


def _isort_style(name: str) -> tuple[int, str]:
    """The order ruff's RUF022 keeps: CONSTANTS, then Classes, then functions."""
    if name.isupper():
        return (0, name)
    if name[0].isupper():
        return (1, name)
    return (2, name)


def test_all_is_sorted() -> None:
    assert delayq.__all__ == sorted(delayq.__all__, key=_isort_style)


def test_all_has_no_duplicates() -> None:
    assert len(set(delayq.__all__)) == len(delayq.__all__)


@pytest.mark.parametrize("name", delayq.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(delayq, name) is not None


@pytest.mark.parametrize(
    "name", ["Publisher", "AsyncPublisher", "apply_topology", "apply_topology_async"]
)
def test_lazy_adapters_are_exported(name: str) -> None:
    assert name in delayq.__all__
    assert callable(getattr(delayq, name))


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        delayq.no_such_thing  # noqa: B018


def test_version_matches_the_installed_distribution() -> None:
    assert delayq.__version__ == importlib.metadata.version("delayq")


# --- the exception tree --------------------------------------------------------------------------


@pytest.mark.parametrize("name", delayq.errors.__all__)
def test_every_error_derives_from_delayq_error(name: str) -> None:
    value = getattr(delayq.errors, name)
    assert inspect.isclass(value)
    assert issubclass(value, delayq.errors.DelayqError)


def test_errors_all_lists_every_public_class() -> None:
    public = {
        name
        for name, value in vars(delayq.errors).items()
        if inspect.isclass(value)
        and not name.startswith("_")
        and issubclass(value, delayq.errors.DelayqError)
    }
    assert public == set(delayq.errors.__all__)


def test_errors_are_exported_from_the_package() -> None:
    for name in delayq.errors.__all__:
        assert getattr(delayq, name) is getattr(delayq.errors, name)


def test_input_errors_and_broker_errors_are_disjoint() -> None:
    assert not issubclass(delayq.InvalidInput, delayq.BrokerError)
    assert not issubclass(delayq.BrokerError, delayq.InvalidInput)


# --- no broker client in the core ----------------------------------------------------------------


def test_core_imports_no_broker_client() -> None:
    code = (
        f"import {', '.join(CORE_MODULES)}; import sys; "
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {BROKER_CLIENTS!r}); "
        "assert not loaded, loaded"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_subprocess_check_can_see_a_broker_client() -> None:
    """The check above is not vacuous: loading an adapter does import pika."""
    code = "import delayq; delayq.Publisher; import sys; assert 'pika' in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# --- redact --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("amqp://user:s3cret@host:5672/vhost", "amqp://user:***@host:5672/vhost"),
        ("amqps://user:s3cret@host/", "amqps://user:***@host/"),
        ("amqp://user:s3cret@[::1]:5672/", "amqp://user:***@[::1]:5672/"),
        ("amqp://:s3cret@host/", "amqp://:***@host/"),
    ],
)
def test_redact_replaces_the_password(url: str, expected: str) -> None:
    assert redact(url) == expected


@pytest.mark.parametrize(
    "url", ["amqp://host/", "amqp://user@host:5672/", "amqp://localhost", "not a url"]
)
def test_redact_leaves_urls_without_password_alone(url: str) -> None:
    assert redact(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "amqp://user:s3cret@host:99999/",
        "amqp://user:s3cret@[::1/",
        "amqp://user:s3cret#frag@host/",
        "amqp://user:s3cret/path@host/",
        "amqp://user:s3cret?q@host/",
    ],
)
def test_redact_hides_the_password_of_malformed_urls(url: str) -> None:
    assert "s3cret" not in redact(url)


def test_exported_classes_are_named_by_the_package() -> None:
    """Reprs and tracebacks say ``delayq.Publisher``, ``delayq.TopologyMissing``; pydantic
    models, dataclasses and enums keep their module (their type hints resolve there)."""
    assert delayq.Publisher.__module__ == "delayq"
    assert delayq.AsyncConsumer.__module__ == "delayq"
    assert delayq.TopologyMissing.__module__ == "delayq"
    assert delayq.SQLiteStore.__module__ == "delayq"
    assert delayq.Topology.__module__ == "delayq.topology.model"
    assert delayq.Message.__module__ == "delayq.message.envelope"
    assert delayq.Strategy.__module__ == "delayq.topology.cascade"
    assert "delayq.TopologyMissing: gone" in "".join(
        __import__("traceback").format_exception_only(delayq.TopologyMissing("gone"))
    )


def test_a_delayq_error_pickles_by_its_package_name() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(delayq.InvalidDelay("bad")))
    assert type(error) is delayq.InvalidDelay and str(error) == "bad"


def test_internal_millisecond_helpers_are_not_top_level() -> None:
    """Durations are typed at the API (``"15m"``, ``timedelta``); the ms helpers live in
    ``delayq.durations`` for whoever needs them."""
    assert not hasattr(delayq, "to_ms") and not hasattr(delayq, "format_ms")
    from delayq.durations import format_ms, to_ms

    assert format_ms(to_ms("90s")) == "1m30s"


def test_the_core_list_covers_the_packages() -> None:
    """Walked, not hand-listed: a module added to a core package is checked too."""
    assert "delayq.topology.route" in CORE_MODULES
    assert "delayq.stores.key_scope" in CORE_MODULES
    assert len(CORE_MODULES) > 40


def test_the_async_twin_of_a_function_says_so_by_name() -> None:
    """``apply_topology`` and ``apply_topology_async`` sit side by side, as ``Publisher`` and
    ``AsyncPublisher`` do: one name never means a function in one module and a coroutine
    function in another."""
    import inspect

    import delayq.aio
    import delayq.sync

    assert not inspect.iscoroutinefunction(delayq.apply_topology)
    assert inspect.iscoroutinefunction(delayq.apply_topology_async)
    assert delayq.sync.apply_topology is delayq.apply_topology
    assert delayq.aio.apply_topology_async is delayq.apply_topology_async
    shared = set(delayq.sync.__all__) & set(delayq.aio.__all__)
    assert not shared, shared

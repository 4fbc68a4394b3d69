"""A local node does not read the caller's environment: RabbitMQ takes unprefixed names
(``LOGS``, ``NODENAME``, ...) as its own settings, so ``LOGS=/tmp`` in a shell made every
``LocalNode().start()`` fail with ``cannot_log_to_file`` (issue 48)."""

from __future__ import annotations

import os

import pika
import pytest

from delayq.local.node import LocalNode, server_installed

pytestmark = pytest.mark.integration

# What RabbitMQ would read as its own, each bad enough to stop or misplace the node.
CALLERS = {
    "LOGS": "/tmp",
    "LOG_BASE": "/nonexistent/log",
    "MNESIA_BASE": "/nonexistent/mnesia",
    "NODENAME": "someone-else@nowhere",
    "NODE_PORT": "1",
    "CONFIG_FILE": "/nonexistent/rabbitmq",
    "ENABLED_PLUGINS_FILE": "/nonexistent/enabled_plugins",
    "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-this-is-not-an-erl-flag",
    "ERL_FLAGS": "+P not-a-number",
}


def test_a_node_starts_whatever_the_caller_has_set(monkeypatch: pytest.MonkeyPatch) -> None:
    if not server_installed():
        if os.environ.get("CI"):
            pytest.fail("rabbitmq-server is not installed (bash scripts/setup.sh installs it)")
        pytest.skip("rabbitmq-server is not installed")
    for name, value in CALLERS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_ALL", "C.UTF-8")  # kept: a locale is the caller's to choose
    node = LocalNode()
    env = node.env()
    assert not set(CALLERS) & set(env)
    assert env["PATH"] == os.environ["PATH"] and env["LC_ALL"] == "C.UTF-8"
    try:
        node.start(attempts=1)
        connection = pika.BlockingConnection(pika.URLParameters(node.url))
        try:
            assert connection.is_open
        finally:
            connection.close()
        assert node.ctl("eval", "node().").strip() == f"'{node.name}'"
    finally:
        node.cleanup()

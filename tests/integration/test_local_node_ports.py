"""A local node whose distribution port is taken between its pick and the node's start."""

from __future__ import annotations

import os
import socket

import pika
import pytest

from delayq.local.node import LocalNode, server_installed

pytestmark = pytest.mark.integration


def test_a_node_whose_distribution_port_was_taken_starts_on_another() -> None:
    # As in CI once: the port was free when picked, something bound it before the node
    # did, and the node exited at once ("dist_port_already_used"), three times over.
    if not server_installed():
        if os.environ.get("CI"):
            pytest.fail("rabbitmq-server is not installed (bash scripts/setup.sh installs it)")
        pytest.skip("rabbitmq-server is not installed")
    node = LocalNode()  # the server of DELAYQ_RABBITMQ_SERVER, as every test's node
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", node.dist_port))
        taken.listen()
        picked = node.dist_port
        try:
            node.start()
            # The first start did meet the taken port (and exited), the next did not.
            assert "dist_port_already_used" in (node.base_dir / "server.out").read_text()
            assert node.dist_port != picked
            connection = pika.BlockingConnection(pika.URLParameters(node.url))
            try:
                assert connection.is_open
            finally:
                connection.close()
        finally:
            node.cleanup()

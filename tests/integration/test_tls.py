"""TLS against a real node with a TLS listener that requires client certificates.

Certificates are made by the ``openssl`` command (delayq.local.tls); the node is a
LocalNode with ``ssl_options.verify = verify_peer`` and
``fail_if_no_peer_cert = true``. Every case runs through both adapters.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from delayq import ConnectionFailed, Message, Topology
from delayq.local.node import LocalNode, LocalNodeError, NodeTLS, server_installed
from delayq.local.tls import Pki, make_pki

PASSWORD = f"tls-{uuid.uuid4().hex}"
USER = "tls-user"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_node(pki: Pki) -> Iterator[LocalNode]:
    if not server_installed():
        reason = "rabbitmq-server is not installed (apt-get install rabbitmq-server)"
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    tls = NodeTLS(
        cacertfile=pki.ca.cert,
        certfile=pki.server.cert,
        keyfile=pki.server.key,
        verify_peer=True,
        fail_if_no_peer_cert=True,
    )
    node = LocalNode(tls=tls)
    try:
        node.start()
        node.ctl("add_user", USER, PASSWORD)
        node.ctl("set_permissions", USER, ".*", ".*", ".*")
    except LocalNodeError:
        node.cleanup()
        raise
    yield node
    node.cleanup()


def amqps(node: LocalNode, **options: Any) -> str:
    """The node's TLS URL for the test user, with these query options."""
    query = urlencode({k: str(v) for k, v in options.items()})
    return f"amqps://{USER}:{PASSWORD}@127.0.0.1:{node.tls_port}/" + (f"?{query}" if query else "")


def trusted(node: LocalNode, pki: Pki, **extra: Any) -> str:
    return amqps(
        node, cafile=pki.ca.cert, certfile=pki.client.cert, keyfile=pki.client.key, **extra
    )


def topology() -> Topology:
    ns = f"tls{uuid.uuid4().hex[:8]}"
    return Topology(
        namespace=ns, ladder=["1s"], destinations=[{"queue": f"{ns}.work", "bindings": ["job.#"]}]
    )


def tls_connections(node: LocalNode) -> list[list[str]]:
    """(name, ssl, peer certificate subject) of the node's client connections."""
    out = node.ctl("list_connections", "client_properties", "ssl", "peer_cert_subject", "--silent")
    return [line.split("\t") for line in out.splitlines() if line.strip()]


def test_publish_and_consume_over_tls_with_a_client_certificate(
    driver_for: Any, start_consumer: Any, tls_node: LocalNode, pki: Pki
) -> None:
    url = trusted(tls_node, pki)
    topo = topology()
    driver = driver_for(url)
    driver.apply(topo)
    received: list[Any] = []
    lock = threading.Lock()

    def handler(body: Any) -> None:
        with lock:
            received.append(body)

    start_consumer(topo, f"{topo.namespace}.work", handler, url=url)
    driver.publish(topo, {"n": 0}, "job.a", "1s")
    driver.publish_many(topo, [Message({"n": n}, "job.a", "0s") for n in range(1, 6)])
    deadline = time.monotonic() + 20
    while len(received) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(b["n"] for b in received) == [0, 1, 2, 3, 4, 5]
    connections = tls_connections(tls_node)
    assert connections, "the node lists no client connection"
    for client_properties, ssl_on, subject in connections:
        assert "delayq" in client_properties
        assert ssl_on == "true"
        assert "CN=delayq-client" in subject


def test_a_wrong_ca_is_a_clear_connection_failure(
    driver_for: Any, tls_node: LocalNode, pki: Pki
) -> None:
    url = amqps(
        tls_node, cafile=pki.other_ca.cert, certfile=pki.client.cert, keyfile=pki.client.key
    )
    driver = driver_for(url)
    started = time.monotonic()
    with pytest.raises(ConnectionFailed) as caught:
        driver.publish(topology(), b"x", "job.a", "1s")
    message = str(caught.value)
    assert message.startswith("TLS verification failed for the broker at amqps://tls-user:***@")
    assert f"trusted: CA file {pki.other_ca.cert}" in message
    assert PASSWORD not in message
    assert time.monotonic() - started < 5  # not retried: it cannot get better
    with pytest.raises(ConnectionFailed) as caught:  # a batch: pika's SelectConnection too
        driver.publish_many(topology(), [Message(b"x", "job.a", "1s")] * 3)
    assert str(caught.value) == message


def test_a_missing_client_certificate_is_a_clear_connection_failure(
    driver_for: Any, tls_node: LocalNode, pki: Pki
) -> None:
    driver = driver_for(amqps(tls_node, cafile=pki.ca.cert))
    with pytest.raises(ConnectionFailed) as caught:
        driver.apply(topology())
    message = str(caught.value)
    # "requires a client certificate", or, when the broker's alert was lost to a
    # reset on every attempt (aiormq, now and then), "may require a client certificate"
    assert re.search(r"requires? a client certificate \(set certfile= and keyfile=", message)
    assert PASSWORD not in message


def test_a_client_certificate_of_another_ca_is_refused_clearly(
    driver_for: Any, tls_node: LocalNode, pki: Pki
) -> None:
    url = amqps(
        tls_node, cafile=pki.ca.cert, certfile=pki.stranger.cert, keyfile=pki.stranger.key
    )
    with pytest.raises(ConnectionFailed) as caught:
        driver_for(url).publish(topology(), b"x", "job.a", "1s")
    # "does not trust", or, when the broker's alert was lost to a reset on every
    # attempt (TLS 1.3 finishes the client's side before the broker checks it), "may not trust"
    assert re.search(r"(does|may) not trust the client certificate", str(caught.value))
    assert str(pki.stranger.cert) in str(caught.value)


def test_server_hostname_is_the_name_checked(
    driver_for: Any, tls_node: LocalNode, pki: Pki
) -> None:
    topo = topology()
    driver_for(trusted(tls_node, pki, server_hostname="localhost")).apply(topo)
    with pytest.raises(ConnectionFailed) as caught:
        driver_for(trusted(tls_node, pki, server_hostname="example.com")).apply(topo)
    assert "Hostname mismatch" in str(caught.value)
    assert "server_hostname=" in str(caught.value)


def test_verify_false_connects_without_checking_the_broker(
    driver_for: Any, tls_node: LocalNode, pki: Pki
) -> None:
    url = amqps(
        tls_node, verify="false", certfile=pki.client.cert, keyfile=pki.client.key
    )  # no cafile: the broker's certificate is not checked at all
    topo = topology()
    driver = driver_for(url)
    driver.apply(topo)
    assert driver.publish(topo, b"x", "job.a", "1s").tier == "1s"


# --- the CLI, with the TLS files from the environment --------------------------------------------


def run_cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return subprocess.run(
        [sys.executable, "-m", "delayq", *args],
        env={**os.environ, "PYTHONPATH": src, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_over_tls_with_files_from_the_environment(
    tls_node: LocalNode, pki: Pki, tmp_path: Path
) -> None:
    topo = topology()
    (tmp_path / "delayq.yaml").write_text(
        f"namespace: {topo.namespace}\nladder: [1s]\ndestinations:\n"
        f"  - queue: {topo.namespace}.work\n    bindings: [job.#]\n"
    )
    env = {
        "DELAYQ_URL": amqps(tls_node),
        "DELAYQ_TLS_CAFILE": str(pki.ca.cert),
        "DELAYQ_TLS_CERTFILE": str(pki.client.cert),
        "DELAYQ_TLS_KEYFILE": str(pki.client.key),
    }
    applied = run_cli(["topology", "apply", "-f", "delayq.yaml"], env, tmp_path)
    assert applied.returncode == 0, applied.stderr
    assert "created" in applied.stdout
    published = run_cli(
        ["publish", "-f", "delayq.yaml", "-k", "job.a", "-d", "1s", "--body", "1"], env, tmp_path
    )
    assert published.returncode == 0, published.stderr
    assert "tier          1s" in published.stdout
    refused = run_cli(
        ["topology", "apply", "-f", "delayq.yaml"],
        {**env, "DELAYQ_TLS_CAFILE": str(pki.other_ca.cert)},
        tmp_path,
    )
    assert refused.returncode == 1
    assert "delayq: error: TLS verification failed" in refused.stderr
    assert str(pki.other_ca.cert) in refused.stderr
    assert "Traceback" not in refused.stderr
    for result in (applied, published, refused):
        assert PASSWORD not in result.stdout + result.stderr

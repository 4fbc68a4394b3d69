"""LocalNode's addresses are attributes (properties), as the README and the docstrings use
them: ``f"{node.tls_url}?cafile=..."`` once built ``"<bound method ...>?cafile=..."``."""

from __future__ import annotations

from pathlib import Path

import pytest

import delayq.local.node as localnode
from delayq.local.cluster import LocalCluster
from delayq.local.node import LocalNode, LocalNodeError, NodeTLS
from delayq.local.servers import LocalPostgres, LocalRedis
from delayq.local.tls import make_pki


@pytest.fixture
def fake_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LocalNode only checks that the server is installed until start()."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rabbitmq-server").write_text("#!/bin/sh\nexit 1\n")
    monkeypatch.setattr(localnode, "RABBITMQ_BIN", bin_dir)


@pytest.mark.usefixtures("fake_server")
def test_a_tls_node_has_its_urls(tmp_path: Path) -> None:
    tls = NodeTLS(
        cacertfile=tmp_path / "ca.pem", certfile=tmp_path / "s.pem", keyfile=tmp_path / "s.key"
    )
    node = LocalNode(tmp_path / "node", management=True, tls=tls)
    assert node.url == f"amqp://guest:guest@127.0.0.1:{node.port}/"
    assert node.management_url == f"http://guest:guest@127.0.0.1:{node.management_port}/"
    assert node.tls_url == f"amqps://guest:guest@127.0.0.1:{node.tls_port}/"
    assert f"{node.tls_url}?cafile=ca.pem".startswith("amqps://guest:guest@127.0.0.1:")
    assert node.running is False


@pytest.mark.usefixtures("fake_server")
def test_a_plain_node_says_it_has_no_tls_listener(tmp_path: Path) -> None:
    node = LocalNode(tmp_path / "node")
    assert node.management_url is None
    with pytest.raises(LocalNodeError, match=r"without tls=NodeTLS"):
        _ = node.tls_url


@pytest.mark.parametrize(
    ("cls", "names"),
    [
        (LocalNode, ("url", "management_url", "tls_url", "running")),
        (LocalCluster, ("url",)),
        (LocalRedis, ("url", "running", "pid", "log_path")),
        (LocalPostgres, ("dsn", "running", "pid", "log_path", "data_dir", "socket_dir")),
    ],
)
def test_documented_attributes_are_properties(cls: type, names: tuple[str, ...]) -> None:
    assert [n for n in names if not isinstance(getattr(cls, n), property)] == []


def test_make_pki_takes_a_relative_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    pki = make_pki("pki")  # as the README writes it; openssl runs inside the folder
    assert pki.ca.cert == tmp_path / "pki" / "ca.pem"
    assert all(p.is_absolute() and p.exists() for p in (pki.client.cert, pki.client.key))

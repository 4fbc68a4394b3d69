"""Which RabbitMQ a local node runs (delayq.local.rabbitmq): chosen explicitly, never a
silent fallback, and a 4.0 tree's commands run in a mount namespace of their own."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from delayq.local.node import LocalNode, LocalNodeError, server_installed
from delayq.local.rabbitmq import UnknownServer, rabbit_server, server_choice


def test_the_choice_is_the_argument_else_the_environment_else_installed(monkeypatch):
    monkeypatch.delenv("DELAYQ_RABBITMQ_SERVER", raising=False)
    assert server_choice() == "installed"
    monkeypatch.setenv("DELAYQ_RABBITMQ_SERVER", "4.0")
    assert server_choice() == "4.0"
    assert server_choice("installed") == "installed"
    assert server_choice(" 4 ") == "4.0"
    assert server_choice("4.3") == "4.3"


@pytest.mark.parametrize("name", ["3.13", "", "latest", "4.1"])
def test_an_unknown_server_names_the_choices(monkeypatch, name):
    with pytest.raises(UnknownServer, match=r"choose one of installed, 4\.0, 4\.3"):
        server_choice(name)
    monkeypatch.setenv("DELAYQ_RABBITMQ_SERVER", name)
    with pytest.raises(UnknownServer, match=r"\$DELAYQ_RABBITMQ_SERVER"):
        server_choice()


@pytest.mark.parametrize(
    ("name", "variable", "version", "script"),
    [
        ("4.0", "DELAYQ_RABBITMQ_4_ROOT", "4.0.5", r"setup-rabbitmq-4\.sh`"),
        ("4.3", "DELAYQ_RABBITMQ_4_3_ROOT", "4.3.6", r"setup-rabbitmq-4\.sh 4\.3`"),
    ],
)
def test_a_tree_that_is_not_finished_is_not_installed_and_says_how_to_build_it(
    tmp_path: Path, monkeypatch, name: str, variable: str, version: str, script: str
):
    root = tmp_path / "tree"
    (root / "usr/lib/rabbitmq/bin").mkdir(parents=True)
    (root / "usr/lib/rabbitmq/bin/rabbitmq-server").write_text("")
    (root / f"usr/lib/rabbitmq/lib/rabbitmq_server-{version}").mkdir(parents=True)
    monkeypatch.setenv(variable, str(root))
    server = rabbit_server(name)
    assert server.version == version and server.root == root
    assert not server.installed() and not server_installed(name)  # no .delayq-ready mark
    missing = rf"RabbitMQ {name} is not set up.*{script}.*{variable}"
    with pytest.raises(LocalNodeError, match=missing):
        LocalNode(server=name)
    (root / ".delayq-ready").write_text(f"rabbitmq-server {version}")
    assert server.installed()
    node = LocalNode(tmp_path / "node", server=name)
    assert node.version == version and node.epmd_port is not None
    assert node.env()["ERL_EPMD_PORT"] == str(node.epmd_port)
    # A node that fails to start leaves its crash dump in its own folder, not the cwd.
    assert node.env()["ERL_CRASH_DUMP"] == str(tmp_path / "node" / "erl_crash.dump")


def test_an_unknown_server_given_to_a_node_is_a_node_error():
    with pytest.raises(LocalNodeError, match="unknown RabbitMQ server"):
        LocalNode(server="5.0")


def test_a_tree_command_binds_tmp_and_the_node_folders_once_each(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DELAYQ_RABBITMQ_4_ROOT", str(tmp_path / "tree"))
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    server = rabbit_server("4.0")
    inside = Path("/tmp/delayq-node-x/sub")
    argv = server.command(
        "rabbitmqctl", ["-n", "n@localhost", "status"], binds=[inside, Path("/srv/certs")],
        env={"HOME": "/tmp/delayq-node-x"},
    )  # fmt: skip
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert "--pid" not in argv  # only the server gets a PID namespace
    folders = argv[argv.index("no") + 1 : argv.index("--", argv.index("no"))]
    assert sorted(folders) == ["/srv/certs", "/tmp"]  # /tmp/... is inside /tmp
    tail = argv[argv.index("/usr/bin/env") :]
    assert tail[-4:] == ["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", "n@localhost", "status"]
    assert "HOME=/tmp/delayq-node-x" in tail
    server_argv = server.command("rabbitmq-server", [], own_pids=True)
    assert {"--pid", "--fork", "--kill-child"} <= set(server_argv)


def _bound(argv: list[str]) -> list[str]:
    return sorted(argv[argv.index("no") + 1 : argv.index("--", argv.index("no"))])


@pytest.mark.parametrize(
    ("temp", "bound"),
    [
        ("/dev/shm/delayq-tests.x", ["/dev/shm/delayq-tests.x", "/srv/certs", "/tmp"]),
        ("/tmp/inner", ["/srv/certs", "/tmp"]),  # inside /tmp: bound with it
        ("/", ["/srv/certs", "/tmp"]),  # would hide the whole tree
        ("{tree_parent}", ["/srv/certs", "/tmp"]),  # would hide the tree itself
    ],
)
def test_a_tree_command_binds_the_temporary_folder_where_a_callers_files_are(
    tmp_path: Path, monkeypatch, temp: str, bound: list[str]
):
    """A definitions file a test or a user writes under $TMPDIR (tmpfs, say) is seen by
    the tree's rabbitmqctl at the same path; a TMPDIR holding the tree is not bound."""
    tree = tmp_path / "var" / "tree"
    monkeypatch.setenv("DELAYQ_RABBITMQ_4_ROOT", str(tree))
    monkeypatch.setattr(tempfile, "tempdir", temp.format(tree_parent=tmp_path / "var"))
    argv = rabbit_server("4.0").command("rabbitmqctl", ["status"], binds=[Path("/srv/certs")])
    assert _bound(argv) == bound


def test_the_installed_server_runs_its_scripts_directly(monkeypatch):
    monkeypatch.setenv("DELAYQ_RABBITMQ_BIN", "/opt/rmq/bin")
    server = rabbit_server("installed")
    assert server.command("rabbitmqctl", ["status"]) == ["/opt/rmq/bin/rabbitmqctl", "status"]
    assert server.command("rabbitmqctl", [], env={"A": "1"}) == [
        "/usr/bin/env",
        "A=1",
        "/opt/rmq/bin/rabbitmqctl",
    ]


def test_the_local_classes_are_where_a_user_looks_first():
    """Issue 29: `from delayq.local import LocalNode` failed; the docs use delayq.local.node."""
    import delayq.local
    import delayq.local.cluster
    import delayq.local.node

    assert delayq.local.LocalNode is delayq.local.node.LocalNode
    assert delayq.local.LocalCluster is delayq.local.cluster.LocalCluster

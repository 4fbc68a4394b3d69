"""Errors of the command line that should be clear (issue 29, items 2 to 4).

* A ``--json`` command that fails prints one JSON error object on stdout (same exit
  code, the human line still on stderr), a refused command line included.
* ``--body-file`` is measured before it is read: a file over the body limit is refused
  with its size and the limit, never read whole.
* ``cancel`` refuses ``--url`` (it only marks the store) and opens no broker connection.

No broker is needed: ``$DELAYQ_URL`` points at a port that refuses connections, so a
command that used it would fail.
"""

from __future__ import annotations

import builtins
import json
import pathlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from delayq.cli import EXIT_BROKER, EXIT_INPUT, EXIT_OK, main

DEAD_URL = "amqp://guest:guest@127.0.0.1:1/"
TOPOLOGY = """\
namespace: shop
ladder: [1m, 30m]
destinations:
  - queue: orders
    bindings: [order.*]
"""


@dataclass
class Run:
    code: int
    out: str
    err: str


@pytest.fixture
def delayq(capsys, monkeypatch):
    monkeypatch.setenv("DELAYQ_URL", DEAD_URL)

    def run(*argv: str) -> Run:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run


@pytest.fixture
def topology_file(tmp_path: Path) -> Path:
    path = tmp_path / "topology.yaml"
    path.write_text(TOPOLOGY)
    return path


def json_error(run: Run, code: int, kind: str) -> dict[str, Any]:
    """stdout is exactly one JSON error object, matching the exit code and stderr's line."""
    assert run.code == code, (run.code, run.out, run.err)
    lines = run.out.splitlines()
    assert len(lines) == 1, run.out
    error = json.loads(lines[0])["error"]
    assert error["type"] == kind and error["exit_code"] == code, error
    assert f"delayq: error: {error['message']}" in run.err, (error, run.err)
    assert "Traceback" not in run.err
    return error


# --json failures (item 2) -------------------------------------------------------------


def test_topology_plan_json_with_a_bad_file_prints_a_json_error(delayq, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("namespace: shop\nladder: [1m, fortnight]\n")
    error = json_error(
        delayq("topology", "plan", "--json", "--file", str(bad)), 2, "InvalidTopology"
    )
    assert "ladder" in error["message"]
    missing = delayq("topology", "plan", "--json", "--file", str(tmp_path / "none.yaml"))
    json_error(missing, 2, "InvalidTopology")


def test_retry_plan_json_with_a_bad_option_prints_a_json_usage_error(delayq, topology_file):
    run = delayq("retry-plan", "--json", "--policy", "sometimes", "--file", str(topology_file))
    error = json_error(run, 2, "UsageError")
    assert "'sometimes'" in error["message"]
    assert "Usage:" in run.err  # the usage lines stay on stderr
    bad_value = delayq("retry-plan", "--json", "--initial", "soon", "--file", str(topology_file))
    json_error(bad_value, 2, "InvalidDelay")


def test_stats_json_with_an_unreachable_broker_prints_a_json_error(delayq, topology_file):
    run = delayq("stats", "--json", "--no-management", "--file", str(topology_file))
    error = json_error(run, 1, "ConnectionFailed")
    assert "cannot connect" in error["message"] and "guest:guest" not in run.out


def test_publish_and_cancel_json_errors(delayq, topology_file, tmp_path):
    publish = delayq("publish", "-k", "order.x", "-d", "90", "--json", "--file", str(topology_file))
    assert "bare number" in json_error(publish, 2, "InvalidDelay")["message"]
    store = f"sqlite:///{tmp_path / 'none' / 'idem.db'}"
    cancel = delayq(
        "cancel", "--message-id", "m", "--store", store, "--json", "-f", str(topology_file)
    )
    json_error(cancel, 2, "InvalidInput")


def test_without_json_stdout_stays_empty(delayq, topology_file):
    run = delayq("stats", "--no-management", "--file", str(topology_file))
    assert run.code == EXIT_BROKER and run.out == "" and "delayq: error:" in run.err


# --body-file over the limit (item 3) ----------------------------------------------------


@pytest.fixture
def huge(tmp_path: Path) -> Path:
    path = tmp_path / "huge.bin"
    with path.open("wb") as f:
        f.truncate(200 * 1024 * 1024)  # sparse: no disk used
    return path


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """Every path opened through ``open`` or ``Path.open`` (``read_bytes`` included)."""
    seen: list[str] = []
    real_open, real_path_open = builtins.open, pathlib.Path.open

    def recording_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(file))
        return real_open(file, *args, **kwargs)

    def recording_path_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(self))
        return real_path_open(self, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", recording_open)
    monkeypatch.setattr(pathlib.Path, "open", recording_path_open)
    return seen


@pytest.mark.parametrize("command", ["publish", "reschedule"])
def test_a_body_file_over_the_limit_is_refused_unread(
    delayq, topology_file, huge, opened, tmp_path, command
):
    argv = [command, "-k", "order.x", "-d", "1m", "--body-file", str(huge)]
    if command == "reschedule":
        argv += ["--message-id", "m-1", "--store", f"sqlite:///{tmp_path / 'idem.db'}"]
    run = delayq(*argv, "--file", str(topology_file), "--json")
    error = json_error(run, 2, "BodyTooLarge")
    assert "209715200 bytes" in error["message"] and "16777216" in error["message"]
    assert str(huge) not in opened  # measured, not read


def test_a_body_file_of_unknown_size_is_read_only_up_to_the_limit(delayq, tmp_path):
    small = tmp_path / "topology.yaml"
    small.write_text(TOPOLOGY + "limits:\n  max_body_bytes: 1024\n")
    run = delayq(
        "publish", "-k", "order.x", "-d", "1m", "--body-file", "/dev/zero", "-f", str(small)
    )
    assert run.code == EXIT_INPUT and "holds more than the body limit of 1024 bytes" in run.err, (
        run.err
    )


# cancel refuses --url (item 4) ------------------------------------------------------------


@pytest.mark.parametrize(
    "where", [["--url", DEAD_URL, "cancel"], ["cancel", "--url", DEAD_URL]], ids=["before", "after"]
)
def test_cancel_refuses_url(delayq, topology_file, tmp_path, where):
    from delayq import SQLiteStore

    SQLiteStore(tmp_path / "idem.db").close()
    store = f"sqlite:///{tmp_path / 'idem.db'}"
    run = delayq(*where, "--message-id", "m-1", "--store", store, "-f", str(topology_file))
    assert run.code == EXIT_INPUT
    assert "--url has no effect on `delayq cancel` (it uses no broker)" in run.err
    again = delayq(
        "cancel", "--message-id", "m-1", "--store", store, "--json", "-f", str(topology_file)
    )
    assert json.loads(again.out)["receipts"][0]["status"] == "unknown"  # nothing was marked


def test_cancel_opens_no_broker_connection(delayq, topology_file, tmp_path, monkeypatch):
    from delayq import links as links_module
    from delayq.sync import publisher as publisher_module

    def no_broker(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("cancel reached for the broker")

    monkeypatch.setattr(publisher_module, "Publisher", no_broker)
    monkeypatch.setattr(links_module, "open_link", no_broker)
    from delayq import SQLiteStore

    SQLiteStore(tmp_path / "idem.db").close()
    store = f"sqlite:///{tmp_path / 'idem.db'}"
    run = delayq(
        "cancel", "--message-id", "m-1", "--store", store, "--json", "-f", str(topology_file)
    )
    assert run.code == EXIT_OK, run.err  # $DELAYQ_URL (a dead broker) is not in the way
    assert json.loads(run.out)["receipts"][0]["status"] == "unknown"


def test_dlq_show_json_of_a_message_not_parked_prints_a_json_error(
    make_topology, rabbitmq_url, delayq, tmp_path
):
    """It said so on stderr and exited 1 with stdout empty."""
    import yaml

    from delayq.sync import apply_topology

    topology = make_topology(["1s"])
    apply_topology(topology, rabbitmq_url)
    path = tmp_path / "applied.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    queue = f"{topology.namespace}.work"
    argv = ["dlq", "show", queue, "no-such-id", "--json", "-f", str(path), "--url", rabbitmq_url]
    error = json_error(delayq(*argv), 1, "MessageNotFound")
    assert "no message 'no-such-id'" in error["message"]

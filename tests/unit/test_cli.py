"""The CLI without a broker: plan, export, and bad input rejected before connecting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from delayq import load_topology, render_definitions
from delayq.cli import EXIT_INPUT, EXIT_OK, main

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topology" / "delayq.yaml"
# Port 1 refuses connections: a command that reaches for the broker fails loudly.
DEAD_URL = "amqp://guest:s3cret@127.0.0.1:1/"


def test_plan_lists_every_declaration_without_a_broker(capsys, monkeypatch):
    monkeypatch.setenv("DELAYQ_URL", DEAD_URL)
    assert main(["topology", "plan", "--file", str(TOPOLOGY)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "queue    delayq.tier.30s [tier]" in out
    assert "x-message-ttl=86400000" in out
    assert "exchange delayq.ready (topic, alternate-exchange='delayq.unrouted')" in out


def test_export_writes_the_definitions_file(tmp_path):
    target = tmp_path / "defs.json"
    assert main(["topology", "export", "--file", str(TOPOLOGY), "-o", str(target)]) == EXIT_OK
    assert target.read_text() == render_definitions(load_topology(TOPOLOGY))
    assert {q["name"] for q in json.loads(target.read_text())["queues"]} >= {
        "delayq.tier.24h",
        "delayq.unrouted",
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["publish", "-k", "orders.reminder", "-d", "5"],
        ["publish", "-k", "orders.reminder", "-d", "25h"],
        ["publish", "-k", "orders.*", "-d", "1m"],
        ["publish", "-k", "orders.reminder", "-d", "1m", "--body", "{not json"],
        ["publish", "-k", "orders.reminder", "-d", "1m", "--body-file", "/no/such/file"],
        ["publish", "-k", "orders.reminder", "-d", "1m", "--url", "http://x"],
        ["topology", "plan", "--file", "/no/such/topology.yaml"],
    ],
)
def test_bad_input_exits_2_with_a_clear_message_and_no_connection(argv, capsys):
    argv = [*argv, "--file", str(TOPOLOGY)] if "--file" not in argv else argv
    if "--url" not in argv and argv[0] == "publish":  # plan takes no --url
        argv += ["--url", DEAD_URL]
    assert main(argv) == EXIT_INPUT
    err = capsys.readouterr().err
    assert err.startswith("delayq: error: ")
    assert "s3cret" not in err


def test_a_dead_broker_exits_1_without_showing_the_password(capsys):
    argv = ["publish", "-k", "orders.reminder", "-d", "1m", "--file", str(TOPOLOGY)]
    assert main([*argv, "--url", DEAD_URL]) == 1
    err = capsys.readouterr().err
    assert "cannot connect" in err and "127.0.0.1:1" in err and "s3cret" not in err


def test_worker_metrics_and_log_flags_parse_with_loopback_and_text_defaults():
    import click

    from delayq.cli import parse

    args = parse(["worker", "app:w", "--metrics-port", "0"]).args
    assert (args.metrics_port, args.metrics_addr, args.log_format) == (0, "127.0.0.1", "text")
    args = parse(["worker", "app:w", "--log-format", "json"]).args
    assert args.metrics_port is None and args.log_format == "json"
    with pytest.raises(click.UsageError):
        parse(["worker", "app:w", "--log-format", "xml"])


@pytest.mark.parametrize("run_fails", [True, False])
def test_a_worker_failure_and_lost_records_are_both_said(tmp_path, monkeypatch, capsys, run_fails):
    """The worker's own failure is not hidden behind the records' (nor the reverse)."""
    from delayq import Worker
    from delayq.errors import ConnectionFailed, RecordsLost
    from delayq.observe.records import DeliveryRecorder

    worker = Worker(load_topology(TOPOLOGY))
    worker.handler("orders.reminders")(lambda body: None)

    def run(*args, **kwargs):
        if run_fails:
            raise ConnectionFailed("cannot reach the broker")

    def close(self):
        raise RecordsLost("3 delivery records were lost", failed=3)

    monkeypatch.setattr(worker, "run", run)
    monkeypatch.setattr("delayq.worker.load_worker", lambda spec: worker)
    monkeypatch.setattr(DeliveryRecorder, "close", close)
    code = main(["worker", "app:worker", "--url", DEAD_URL, "--records", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "3 delivery records were lost" in err
    assert ("cannot reach the broker" in err) is run_fails


# --- --json on every listing ---------------------------------------------------------------

QUICKSTART = ROOT / "topology" / "quickstart.yaml"


def _json_of(capsys, argv: list[str], code: int = EXIT_OK):
    assert main(argv) == code
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_plan_json_lists_every_declaration(capsys, monkeypatch):
    monkeypatch.setenv("DELAYQ_URL", DEAD_URL)
    data, _ = _json_of(capsys, ["topology", "plan", "--file", str(QUICKSTART), "--json"])
    assert data["namespace"] == "quickstart"
    assert data["ladder"] == ["5s", "1m", "10m"]
    names = {(d["kind"], d.get("name")) for d in data["declarations"]}
    assert ("queue", "quickstart.tier.5s") in names
    assert ("queue", "emails.dlq") in names
    tier = next(
        d
        for d in data["declarations"]
        if d["kind"] == "queue" and d["name"] == "quickstart.tier.5s"
    )
    assert tier["arguments"]["x-message-ttl"] == 5000
    assert len(data["declarations"]) == 38  # as many as the text plan counts


def test_retry_plan_json_gives_each_retry_and_the_dead_letter(capsys):
    data, _ = _json_of(
        capsys,
        [
            "retry-plan",
            "--file",
            str(QUICKSTART),
            "--policy",
            "fixed",
            "--delay",
            "5s",
            "--max-attempts",
            "3",
            "--json",
        ],
    )
    assert [r["attempt"] for r in data["retries"]] == [2, 3]
    assert {r["tier"] for r in data["retries"]} == {"5s"}
    assert data["dead_letter"] == {"after_attempts": 3, "reason": "exhausted"}
    assert data["too_long"] is None


def test_retry_plan_json_of_a_policy_longer_than_the_ladder_exits_2_and_says_so(capsys):
    data, err = _json_of(
        capsys,
        [
            "retry-plan",
            "--file",
            str(QUICKSTART),
            "--initial",
            "5m",
            "--max-delay",
            "1h",
            "--max-attempts",
            "5",
            "--json",
        ],
        EXIT_INPUT,
    )
    assert data["dead_letter"]["reason"] == "delay-too-long"
    assert data["too_long"]["requested_ms"] > 600_000
    assert "a Consumer or Worker refuses it" in err


def test_grant_json_gives_each_role_its_permissions(capsys):
    data, _ = _json_of(
        capsys,
        [
            "topology",
            "grant",
            "--file",
            str(QUICKSTART),
            "--producer-user",
            "p",
            "--consumer-user",
            "c",
            "--json",
        ],
    )
    assert [(g["role"], g["user"]) for g in data] == [("producer", "p"), ("consumer", "c")]
    assert data[0]["configure"] == "^$"
    assert data[1]["rabbitmqctl"].startswith("rabbitmqctl set_permissions")
    assert all(g["reasons"] for g in data)

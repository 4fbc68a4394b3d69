"""The operations commands without a broker: grant prints, bad input exits 2, apply errors."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from delayq import load_topology
from delayq.cli import EXIT_BROKER, EXIT_INPUT, EXIT_OK, main
from delayq.errors import BrokerError, InvalidInput
from delayq.ops.grant import admin_grant, consumer_grant, producer_grant
from delayq.ops.permissions import apply_grant

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topology" / "delayq.yaml"
DEAD_URL = "amqp://guest:s3cret@127.0.0.1:1/"
VIA_MANAGEMENT = ["topology", "grant", "--producer-user", "a", "--apply", "--via", "management"]


def test_grant_prints_one_rabbitmqctl_command_per_user(capsys):
    argv = ["topology", "grant", "--file", str(TOPOLOGY), "--url", DEAD_URL]
    users = ["--producer-user", "app", "--consumer-user", "worker", "--admin-user", "ops"]
    assert main([*argv, *users]) == EXIT_OK
    out = capsys.readouterr().out
    commands = [shlex.split(line) for line in out.splitlines() if line.startswith("rabbitmqctl ")]
    topology = load_topology(TOPOLOGY)
    wanted = [
        producer_grant(topology, "app"),
        consumer_grant(topology, "worker"),
        admin_grant(topology, "ops"),
    ]
    assert commands == [["rabbitmqctl", *g.rabbitmqctl_args()] for g in wanted]
    assert "# producer 'app' on vhost '/'" in out and "# consumer 'worker' on vhost '/'" in out
    assert "# admin 'ops' on vhost '/'" in out
    assert "s3cret" not in out


def test_grant_takes_the_vhost_and_the_rabbitmqctl_command(capsys):
    argv = ["topology", "grant", "--file", str(TOPOLOGY), "--producer-user", "app"]
    assert main([*argv, "--vhost", "/prod", "--rabbitmqctl", "rabbitmqctl -n rabbit@mq1"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("rabbitmqctl"))
    assert shlex.split(line)[:6] == [
        "rabbitmqctl",
        "-n",
        "rabbit@mq1",
        "set_permissions",
        "-p",
        "/prod",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["topology", "grant"], "--admin-user, --bridge-user, or several"),
        (["topology", "grant", "--bridge-user", ""], "--bridge-user is empty"),
        (["topology", "grant", "--producer-user", " "], "--producer-user is empty"),
        ([*VIA_MANAGEMENT, "--no-management"], "--no-management"),
        (
            [*VIA_MANAGEMENT, "--management-url", "ftp://u:s3cret@h/"],
            "http://user:pass@host:15672/",
        ),
        (
            [
                "topology",
                "grant",
                "--producer-user",
                "a",
                "--apply",
                "--rabbitmqctl",
                "/no/such/rabbitmqctl",
            ],
            "was not found",
        ),
        (["topology", "verify", "--probe-timeout", "5"], "--probe-timeout"),
        (["topology", "verify", "--probe-timeout", "0s"], "at least 1 ms"),
        (["topology", "verify", "--management-url", "amqp://u:s3cret@h/"], "management URL"),
        (["stats", "--management-url", "localhost:15672"], "management URL"),
    ],
)
def test_bad_input_exits_2_before_reaching_a_broker(argv, message, capsys):
    assert main([*argv, "--file", str(TOPOLOGY), "--url", DEAD_URL]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert err.startswith("delayq: error: ") and message in err
    assert "s3cret" not in err


@pytest.mark.parametrize("command", [["topology", "verify"], ["stats"]])
def test_a_dead_broker_exits_1_without_the_password(command, capsys):
    argv = [*command, "--file", str(TOPOLOGY), "--url", DEAD_URL]
    assert main([*argv, "--management-url", "http://guest:s3cret@127.0.0.1:1/"]) == EXIT_BROKER
    err = capsys.readouterr().err
    assert "cannot connect" in err and "s3cret" not in err


def test_a_failing_rabbitmqctl_is_a_broker_error_with_its_output(tmp_path):
    fake = tmp_path / "rabbitmqctl"
    fake.write_text("#!/bin/sh\necho 'Error: no_such_user' >&2\nexit 69\n")
    fake.chmod(0o755)
    grant = producer_grant(load_topology(TOPOLOGY), "ghost")
    with pytest.raises(BrokerError, match=re.escape("failed (69): Error: no_such_user")):
        apply_grant(grant, "rabbitmqctl", rabbitmqctl=[str(fake)])


def test_rabbitmqctl_gets_exactly_the_grants_arguments(tmp_path):
    fake = tmp_path / "rabbitmqctl"
    record = tmp_path / "args"
    fake.write_text(
        f"#!{sys.executable}\nimport sys, json\n"
        f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    fake.chmod(0o755)
    grant = consumer_grant(load_topology(TOPOLOGY), "worker")
    apply_grant(grant, "rabbitmqctl", rabbitmqctl=[str(fake), "-n", "rabbit@x"])
    assert json.loads(record.read_text()) == ["-n", "rabbit@x", *grant.rabbitmqctl_args()]


def test_management_without_an_api_is_bad_input():
    with pytest.raises(InvalidInput):
        apply_grant(producer_grant(load_topology(TOPOLOGY), "a"), "management")
    with pytest.raises(InvalidInput):
        apply_grant(producer_grant(load_topology(TOPOLOGY), "a"), "ssh")

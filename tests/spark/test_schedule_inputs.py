"""delayq.spark.schedule's checks and inputs: --dry-run, repeated keys (reject or
keep-last), unbound routing keys, an id column in the errors output, default partitions,
progress in rows, and the CLI's --option, --table and misuse."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pika
import pytest
import yaml

from delayq import InvalidInput, RowsRejected
from delayq.cli import main
from delayq.spark import schedule
from delayq.spark._inputs import input_columns, prepare
from delayq.sync import apply_topology
from tests.amqp import depth
from tests.spark.outputs import read_errors
from tests.waiting import wait_for

SCHEMA = "key string, routing_key string, delay string, body string, ref string"


def queues(topology: Any) -> list[str]:
    return [f"{topology.namespace}.work", *(f"{topology.namespace}.tier.{t}" for t in ("1s", "2s"))]


def first_body(url: str, queue: str) -> bytes:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        _method, _props, body = connection.channel().basic_get(queue, auto_ack=True)
    finally:
        connection.close()
    assert body is not None
    return bytes(body)


def test_a_dry_run_plans_every_row_publishes_nothing_and_fails_as_a_real_run(
    spark: Any, rabbitmq_url: str, make_topology: Any
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    rows = [(f"k{n}", "job.a", "1s", "x", f"r{n}") for n in range(20)]
    rows += [
        ("typo", "jbo.a", "1s", "x", "r-typo"),  # no binding: would land in <ns>.unrouted
        ("twice", "job.a", "1s", "first", "r-t1"),
        ("twice", "job.a", "2s", "second", "r-t2"),
    ]
    df = spark.createDataFrame(rows, SCHEMA)
    told: list[tuple[int, int]] = []
    summary = schedule(
        df,
        url=rabbitmq_url,
        topology=topology,
        delay_col="delay",
        dry_run=True,
        max_rejected=None,
        progress=lambda done, total: told.append((done, total)),
    )
    assert summary.dry_run and summary.published == {"1s": 20}
    assert summary.errors == {"UnboundRoutingKey": 1, "DuplicateKey": 2}
    assert summary.duplicate_in_input == 2
    assert "would publish" in summary.render() and "nothing was published" in summary.render()
    reasons = {(r["key"], r["error"]): r["reason"] for r in summary.rejections}
    assert "matches no binding" in reasons[("typo", "UnboundRoutingKey")]
    assert "'twice' is on 2 rows" in reasons[("twice", "DuplicateKey")]
    assert told[-1] == (21, 21)  # the repeated key's rows are settled before the tasks
    assert [depth(rabbitmq_url, q) for q in queues(topology)] == [0, 0, 0]

    every_rejected = spark.createDataFrame([("a", "job.a", "soon", None, None)], SCHEMA)
    with pytest.raises(RowsRejected, match="1 of 1 rows were rejected") as caught:
        schedule(every_rejected, url=rabbitmq_url, topology=topology, delay_col="delay",
                 dry_run=True)
    assert caught.value.summary.dry_run


def test_keep_last_publishes_the_last_row_of_a_key_and_counts_the_others(
    spark: Any, rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    source = tmp_path / "rows.jsonl"  # one file: "last" is the last line
    lines = [
        {"key": "cust-1", "routing_key": "job.a", "delay": "0s", "body": "first"},
        {"key": "cust-2", "routing_key": "job.a", "delay": "0s", "body": "other"},
        {"key": "cust-1", "routing_key": "job.a", "delay": "0s", "body": "second"},
        {"key": "cust-1", "routing_key": "job.a", "delay": "0s", "body": "third"},
    ]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    df = spark.read.json(str(source))
    summary = schedule(
        df.where("key = 'cust-1'"),
        url=rabbitmq_url,
        topology=topology,
        delay_col="delay",
        duplicates="keep-last",
    )
    assert summary.published == {"immediate": 1} and summary.total_rejected == 0
    assert summary.duplicate_in_input == 2 and "duplicate-in-input: 2" in summary.render()
    work = f"{topology.namespace}.work"
    wait_for(lambda: depth(rabbitmq_url, work) == 1, 30, "the last row's message")
    assert b"third" in first_body(rabbitmq_url, work)
    with pytest.raises(InvalidInput, match="reject or keep-last"):
        schedule(df, url=rabbitmq_url, topology=topology, delay_col="delay", duplicates="first")


def test_the_id_column_goes_into_the_errors_output_and_must_exist(
    spark: Any, rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    rows = [(None, "job.a", "1s", "x", "row-7"), ("ok", "job.a", "soon", "x", "row-8")]
    df = spark.createDataFrame(rows, SCHEMA)
    errors = tmp_path / "errors"
    summary = schedule(
        df, url=rabbitmq_url, topology=topology, delay_col="delay", id_col="ref",
        errors_path=str(errors), max_rejected=None,
    )
    assert summary.total_rejected == 2
    found = {e["ref"]: e for e in read_errors(errors)}
    assert found["row-7"].get("key") is None and found["row-7"]["error"] == "InvalidMessageId"
    assert found["row-8"]["error"] == "InvalidDelay"
    listed = schedule(df, url=rabbitmq_url, topology=topology, delay_col="delay",
                      id_col="ref", max_rejected=None)
    assert sorted(r["ref"] for r in listed.rejections) == ["row-7", "row-8"]
    with pytest.raises(InvalidInput, match="no column 'order_id'"):
        schedule(df, url=rabbitmq_url, topology=topology, delay_col="delay", id_col="order_id")
    with pytest.raises(InvalidInput, match="clash"):
        schedule(df, url=rabbitmq_url, topology=topology, delay_col="delay", id_col="reason")


def test_a_single_partition_input_is_spread_over_the_default_parallelism(spark: Any) -> None:
    df = spark.createDataFrame([(f"k{n}", "job.a", "1s") for n in range(50)],
                               "key string, routing_key string, delay string").coalesce(1)
    selected = input_columns(df, "key", "routing_key", "delay", None, None)
    parallelism = spark.sparkContext.defaultParallelism
    assert parallelism > 1
    prepared = prepare(selected, duplicates="reject", partitions=None, key_col="key")
    assert prepared.rows.rdd.getNumPartitions() == parallelism
    assert prepared.rows_read == prepared.to_tasks == 50
    given = prepare(selected, duplicates="reject", partitions=5, key_col="key")
    assert given.rows.rdd.getNumPartitions() == 5
    wide = prepare(selected.repartition(parallelism + 1), duplicates="reject",
                   partitions=None, key_col="key")
    assert wide.rows.rdd.getNumPartitions() == parallelism + 1  # never fewer than given


@pytest.fixture
def topo_file(rabbitmq_url: str, make_topology: Any, tmp_path: Path) -> tuple[Any, Path]:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    return topology, path


def test_cli_reads_a_csv_written_by_python_as_written_quotes_and_newlines_included(
    spark: Any, rabbitmq_url: str, topo_file: tuple[Any, Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """RFC 4180 quotes (doubled) and quoted cells over several lines are read by default;
    Spark's own escape, asked for, rejects the doubled quotes with a reason naming the
    option that reads them."""
    topology, path = topo_file
    source = tmp_path / "rows.csv"
    with source.open("w", newline="") as out:
        writer = csv.writer(out)  # the body as `"{""n"": 0}"`, rows ending in CRLF
        writer.writerow(["key", "routing_key", "delay", "body"])
        writer.writerows([f"k{n}", "job.a", "1s", json.dumps({"n": n})] for n in range(30))
    assert '"{""n"": 0}"' in source.read_text()
    base = ["spark", "schedule", str(source), "--file", str(path), "--url", rabbitmq_url,
            "--delay-col", "delay", "--body-json"]  # fmt: skip
    assert main([*base, "--option", "escape=\\", "--dry-run"]) == 1  # Spark's default
    out = capsys.readouterr().out
    assert "30 InvalidBody" in out
    assert "its quotes are doubled" in out and "--option escape='\"'" in out
    code = main([*base, "--option", "mode=FAILFAST"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "1s          30          0" in out
    assert "publishing: 30/30 rows (100%)" in err

    assert main([*base, "--option", "escape"]) == 2
    assert "'escape' is not KEY=VALUE" in capsys.readouterr().err

    # Text bodies over several lines: whole, a CRLF inside the cell arriving as LF.
    texts = tmp_path / "texts.csv"
    bodies = {"t1": "line one\nline two", "t2": "crlf one\r\ncrlf two", "t3": 'say "hi"'}
    with texts.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["key", "routing_key", "delay", "body"])
        writer.writerows([key, "job.a", "0s", body] for key, body in bodies.items())
    code = main(["spark", "schedule", str(texts), "--file", str(path), "--url", rabbitmq_url,
                 "--delay-col", "delay"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "immediate           3          0" in out
    got = wait_for_bodies(rabbitmq_url, f"{topology.namespace}.work", 33)  # and the 30
    texts_got = [body for body in got if not body.startswith('{"n":')]
    assert sorted(texts_got) == sorted(b.replace("\r\n", "\n") for b in bodies.values())


def wait_for_bodies(url: str, queue: str, count: int) -> list[str]:
    """The bodies of ``count`` messages taken off ``queue`` (waiting up to 30 s)."""
    import time

    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        got: list[str] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            method, _props, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                time.sleep(0.05)
                continue
            got.append(body.decode())
        return got
    finally:
        connection.close()


def test_cli_table_and_dry_run(
    spark: Any, rabbitmq_url: str, topo_file: tuple[Any, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    topology, path = topo_file
    spark.createDataFrame(
        [("a", "job.a", "soon"), ("b", "job.a", "later")],
        "key string, routing_key string, delay string",
    ).createOrReplaceTempView("delayq_inputs_rejected")
    base = ["spark", "schedule", "--file", str(path), "--url", rabbitmq_url,
            "--delay-col", "delay", "--body-col", "none"]
    code = main([*base, "--table", "delayq_inputs_rejected", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 1, err  # every row rejected: not green
    assert "would publish" in out and "dry run: nothing was published" in out
    assert "checking (dry run) table delayq_inputs_rejected" in err
    assert [depth(rabbitmq_url, q) for q in queues(topology)] == [0, 0, 0]

    spark.createDataFrame([("c", "job.a", "1s")], "key string, routing_key string, delay string"
                          ).createOrReplaceTempView("delayq_inputs_good")
    assert main([*base, "--table", "delayq_inputs_good", "--dry-run"]) == 0
    assert main([*base, "--table", "delayq_inputs_good"]) == 0
    capsys.readouterr()
    work = f"{topology.namespace}.work"  # through the 1s tier
    wait_for(lambda: depth(rabbitmq_url, work) == 1, 30, "row c in the work queue")

    assert main([*base, "--table", "no_such_table"]) == 2
    assert "cannot read table 'no_such_table'" in capsys.readouterr().err
    assert main([*base, "--table", "delayq_inputs_good", "--option", "sep=;"]) == 2
    assert "--option is for INPUT's reader" in capsys.readouterr().err
    assert main([*base, "some.jsonl", "--table", "delayq_inputs_good"]) == 2
    assert "give INPUT or --table, not both" in capsys.readouterr().err
    assert main(base) == 2
    assert "give INPUT (a file or directory) or --table NAME" in capsys.readouterr().err
    assert main([*base, "--table", "delayq_inputs_good", "--id-column", "ref"]) == 2
    assert "no column 'ref'" in capsys.readouterr().err


def test_tasks_tell_the_driver_their_rows_and_a_listener_out_of_reach_changes_nothing() -> None:
    from types import SimpleNamespace

    from delayq.cli.spark_inputs import progress_line
    from delayq.spark._progress import RowCounter, counting

    conf = SimpleNamespace(get=lambda name: "127.0.0.1")
    fake = SimpleNamespace(sparkContext=SimpleNamespace(getConf=lambda: conf))
    counter = RowCounter(fake)

    def task(rows: Any) -> Any:
        yield ("n", sum(1 for _ in rows))

    told: list[tuple[int, int]] = []
    with counter.watching(1000, lambda done, total: told.append((done, total))):
        assert list(counting(task, counter)(iter(range(600)))) == [("n", 600)]
        assert list(counting(task, counter)(iter(range(400)))) == [("n", 400)]
    assert told[-1] == (1000, 1000)
    # the listener gone (a firewall, say): the rows are all read, uncounted
    assert list(counting(task, counter)(iter(range(10)))) == [("n", 10)]
    assert counting(task, None) is task
    assert progress_line("publishing", 0, 10, 0.0) == "publishing: 0/10 rows (0%)"
    assert progress_line("checking", 10, 10, 2.0) == "checking: 10/10 rows (100%), 5 rows/s"

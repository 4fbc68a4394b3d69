"""The Spark jobs record what they schedule in a schedule index (issue 51):
``delayq spark schedule --schedule-index`` leaves one scheduled entry per message
confirmed, each in its tier at the broker; an index the job cannot open is refused
before anything is published."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq.cli import main
from delayq.schedule.entry import State
from delayq.schedule.query import Query
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.sync import apply_topology

from ..amqp import depth
from ..waiting import wait_for


def _job(tmp_path: Path, rabbitmq_url: str, topology: Any, rows: int) -> list[str]:
    apply_topology(topology, rabbitmq_url)
    topo_file = tmp_path / "topology.yaml"
    topo_file.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    source = tmp_path / "rows.jsonl"
    waits = ("2s", "4s")
    source.write_text(
        "".join(
            json.dumps({"id": n, "kind": "job.a", "wait": waits[n % 2], "payload": {"n": n}}) + "\n"
            for n in range(rows)
        )
    )
    return [
        "spark", "schedule", str(source), "--file", str(topo_file), "--url", rabbitmq_url,
        "--key-col", "id", "--routing-key-col", "kind", "--delay-col", "wait",
        "--body-col", "payload", "--partitions", "3", "--window", "40",
    ]  # fmt: skip


def test_a_scheduling_job_records_each_message_it_scheduled(
    spark: Any,
    rabbitmq_url: str,
    make_topology: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topology = make_topology()
    command = _job(tmp_path, rabbitmq_url, topology, 301)
    index_path = tmp_path / "index.db"
    code = main([*command, "--schedule-index", str(index_path)])
    err = capsys.readouterr().err
    assert code == 0, err
    index = SQLiteSchedule(index_path)
    try:
        assert index.count(Query(namespace=topology.namespace)) == 301
        assert index.count(Query(states=set(State) - {State.SCHEDULED})) == 0
        entries = index.find(Query(namespace=topology.namespace), limit=1000)
    finally:
        index.close()
    assert sorted(e.id for e in entries) == sorted({e.id for e in entries})
    assert [e.tier for e in entries].count("2s") == 151
    assert [e.tier for e in entries].count("4s") == 150
    queue = f"{topology.namespace}.work"  # each arrives once: as many as the index holds
    wait_for(lambda: depth(rabbitmq_url, queue) == 301, 60, lambda: f"301 in {queue}")
    assert {e.routing_key for e in entries} == {"job.a"}


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("ftp://host/index", "--schedule-index 'ftp://host/index'"),
        ("consumers.db", "not a schedule index"),
    ],
)
def test_an_index_the_job_cannot_use_is_refused_before_anything_is_published(
    spark: Any,
    rabbitmq_url: str,
    make_topology: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    given: str,
    said: str,
) -> None:
    import sqlite3

    topology = make_topology()
    command = _job(tmp_path, rabbitmq_url, topology, 10)
    if given == "consumers.db":  # the consumers' store, named by mistake
        given = str(tmp_path / given)
        with sqlite3.connect(given) as db:
            db.execute("CREATE TABLE delayq_claims (key TEXT)")
        db.close()
    code = main([*command, "--schedule-index", given])
    out, err = capsys.readouterr()
    assert code != 0, out
    assert said in err and "Traceback" not in err, err
    assert "publishing" not in err
    for tier in topology.ladder.tiers:
        assert depth(rabbitmq_url, topology.tier_name(tier)) == 0

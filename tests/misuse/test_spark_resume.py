"""``delayq spark schedule --resume DIR`` knows which run and which input it resumes.

A run killed mid-way never writes its errors output, so DIR still holds what an earlier,
finished run left there: a resume that trusted those files sent nothing and exited 0
with about half of the input never scheduled. The run record (``_delayq_run.json``,
written before anything is sent) says the run never finished, and the resume sends
every row but those of the partitions it marked confirmed whole (``_delayq_done/``);
another input, a dry run's output, a directory without a record and a run that left
nothing unconfirmed are refused, naming why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq.cli import main
from delayq.sync import apply_topology
from tests.amqp import depth
from tests.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]  # the Spark worker's JVM

ROWS = 20_000


def _rows(path: Path, count: int, delay: str = "1h") -> Path:
    path.write_text(
        "".join(
            json.dumps({"key": f"k{n}", "routing_key": "job.a", "delay": delay, "body": n}) + "\n"
            for n in range(count)
        )
    )
    return path


@pytest.fixture
def topology_file(rabbitmq_url: str, make_topology: Any, tmp_path: Path) -> tuple[Path, str]:
    """An applied topology's file, and its 1h tier queue (where the rows wait)."""
    topology = make_topology(ladder=["1s", "1h"])
    apply_topology(topology, rabbitmq_url)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    return path, f"{topology.namespace}.tier.1h"


def _command(source: Path, topology: Path, url: str, *extra: str) -> list[str]:
    return [
        "spark", "schedule", str(source), "--file", str(topology), "--url", url,
        "--delay-col", "delay", *extra,
    ]  # fmt: skip


def _parquet(spark: Any, path: Path, count: int) -> Path:
    rows = [(f"k{n}", "job.a", "1h", str(n)) for n in range(count)]
    schema = "key string, routing_key string, delay string, body string"
    spark.createDataFrame(rows, schema).repartition(4).write.parquet(str(path))
    return path


def _marked(errors: Path) -> int:
    """Partitions the run writing ``errors`` marked confirmed whole (``.crc`` files aside)."""
    done = errors / "_delayq_done"
    return len([p for p in done.iterdir() if not p.name.startswith(".")]) if done.is_dir() else 0


def test_a_resume_after_a_killed_run_sends_what_it_had_not_confirmed_whole(
    spark: Any,
    rabbitmq_url: str,
    topology_file: tuple[Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topology, tier = topology_file
    source = _parquet(spark, tmp_path / "rows.parquet", ROWS)  # issue 48: Parquet, via the CLI
    errors = tmp_path / "errors"
    command = [*_command(source, topology, rabbitmq_url, "--format", "parquet"),
               "--partitions", "4"]  # fmt: skip
    # An earlier run of the same input finished, every row confirmed: its output is in DIR.
    assert main([*command, "--errors", str(errors)]) == 0
    capsys.readouterr()
    assert depth(rabbitmq_url, tier) == ROWS

    # The next run into the same DIR (another Spark session: a process of its own) is
    # killed while it publishes (one confirm at a time), once a partition was marked
    # confirmed whole.
    killed = subprocess.Popen(
        [sys.executable, "-m", "delayq", *command, "--errors", str(errors), "--window", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: _marked(errors) >= 1, 120, lambda: "a partition marked confirmed")
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(30)
    sent_before = depth(rabbitmq_url, tier) - ROWS
    assert sent_before < ROWS, "the run was killed before it finished"
    marked = _marked(errors)

    again = tmp_path / "errors-2"
    code = main([*command, "--errors", str(again), "--resume", str(errors)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "which was interrupted before it finished" in out
    assert f"the {marked} partition(s) it got confirmed whole" in out
    # The same partitions (--partitions 4 both times): each marked one skipped.
    skipped = marked * ROWS // 4
    assert f"skipped: {skipped:,} rows the resumed run got confirmed" in out
    assert f"total       {ROWS - skipped}          0" in out
    wait_for(
        lambda: depth(rabbitmq_url, tier) >= 2 * ROWS + sent_before - skipped,
        30,
        lambda: "the resumed run's messages in the tier",
    )

    # The resumed run's own record: complete, a resume of that DIR, nothing unconfirmed.
    record = json.loads((again / "_delayq_run.json").read_text())
    assert (record["state"], record["resumed_from"], record["unconfirmed"]) == (
        "complete",
        str(errors),
        0,
    )


def test_a_resume_of_a_run_that_left_nothing_unconfirmed_is_refused(
    spark: Any,
    rabbitmq_url: str,
    topology_file: tuple[Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topology, tier = topology_file
    source = _rows(tmp_path / "rows.jsonl", 20)
    errors = tmp_path / "errors"
    assert main(_command(source, topology, rabbitmq_url, "--errors", str(errors))) == 0
    capsys.readouterr()
    code = main(_command(source, topology, rabbitmq_url, "--resume", str(errors)))
    err = capsys.readouterr().err
    assert code == 2
    assert f"delayq: error: nothing to resume from {errors}: run " in err
    assert "with no row unconfirmed" in err and "Traceback" not in err
    assert depth(rabbitmq_url, tier) == 20  # nothing sent by the refused resume


def test_a_resume_of_another_input_or_a_changed_one_is_refused(
    spark: Any,
    rabbitmq_url: str,
    topology_file: tuple[Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topology, tier = topology_file
    source = _rows(tmp_path / "rows.jsonl", 20)
    errors = tmp_path / "errors"
    assert main(_command(source, topology, rabbitmq_url, "--errors", str(errors))) == 0
    capsys.readouterr()

    other = _rows(tmp_path / "other.jsonl", 30)
    assert main(_command(other, topology, rabbitmq_url, "--resume", str(errors))) == 2
    err = capsys.readouterr().err
    assert f"delayq: error: cannot resume from {errors}: run " in err
    assert f"read another input ({(tmp_path / 'other.jsonl').as_uri()} was not read then)" in err

    _rows(source, 25)  # the same file, rewritten
    assert main(_command(source, topology, rabbitmq_url, "--resume", str(errors))) == 2
    err = capsys.readouterr().err
    assert f"read another input ({source.as_uri()} changed: " in err

    # Other columns of the same file are another job.
    _rows(tmp_path / "third.jsonl", 20)
    third = tmp_path / "errors-3"
    assert main(_command(tmp_path / "third.jsonl", topology, rabbitmq_url,
                         "--errors", str(third))) == 0  # fmt: skip
    capsys.readouterr()
    code = main(_command(tmp_path / "third.jsonl", topology, rabbitmq_url,
                         "--resume", str(third), "--body-col", "none"))  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "another source, reader options or columns (the Spark plan differs)" in err
    assert depth(rabbitmq_url, tier) == 40  # nothing sent by the refused resumes


def test_a_resume_of_a_dry_run_or_of_a_directory_without_a_record_is_refused(
    spark: Any,
    rabbitmq_url: str,
    topology_file: tuple[Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topology, tier = topology_file
    source = _rows(tmp_path / "rows.jsonl", 20)
    dry = tmp_path / "dry"
    assert main(_command(source, topology, rabbitmq_url, "--errors", str(dry), "--dry-run")) == 0
    capsys.readouterr()
    assert main(_command(source, topology, rabbitmq_url, "--resume", str(dry))) == 2
    err = capsys.readouterr().err
    assert f"cannot resume from {dry}: it is the output of a dry run (run " in err

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "part-0.json").write_text("")
    assert main(_command(source, topology, rabbitmq_url, "--resume", str(plain))) == 2
    err = capsys.readouterr().err
    assert f"cannot resume from {plain}: it has no _delayq_run.json" in err

    assert main(_command(source, topology, rabbitmq_url, "--resume", str(tmp_path / "no"))) == 2
    err = capsys.readouterr().err
    assert f"cannot resume from {tmp_path / 'no'}: no such directory" in err
    assert "Traceback" not in err
    assert depth(rabbitmq_url, tier) == 0


def test_rows_made_in_python_are_known_again_by_their_content(
    spark: Any, rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    """``createDataFrame`` of Python rows has a new plan each time it is built: the same
    rows are the same input, other rows another."""
    from delayq.errors import InvalidInput
    from delayq.spark import schedule

    topology = make_topology(ladder=["1s", "1h"])
    apply_topology(topology, rabbitmq_url)
    rows = [(f"k{n}", "job.a", "1h", str(n)) for n in range(50)]
    schema = "key string, routing_key string, delay string, body string"
    errors = str(tmp_path / "errors")
    common = {"url": rabbitmq_url, "topology": topology, "delay_col": "delay"}
    schedule(spark.createDataFrame(rows, schema), errors_path=errors, **common)
    with pytest.raises(InvalidInput, match="nothing to resume from"):
        schedule(spark.createDataFrame(rows, schema), resume_from=errors, **common)
    with pytest.raises(InvalidInput, match="read another input"):
        schedule(spark.createDataFrame(rows[:-1], schema), resume_from=errors, **common)
    assert depth(rabbitmq_url, f"{topology.namespace}.tier.1h") == 50

"""The ``delayq spark`` commands end to end: a JSON-lines file scheduled into a real broker,
and a report written from records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq.cli import main
from delayq.sync import apply_topology

from .test_report import generated


def test_schedule_a_json_lines_file_then_report_records(
    spark: Any,
    rabbitmq_url: str,
    make_topology: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    topo_file = tmp_path / "topology.yaml"
    topo_file.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    rows = [{"id": n, "kind": "job.a", "wait": "2s", "payload": {"n": n}} for n in range(100)]
    rows.append({"id": 100, "kind": "job.a", "wait": "1d", "payload": {"n": 100}})
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))

    command = [
        "spark", "schedule", str(source), "--file", str(topo_file), "--url", rabbitmq_url,
        "--key-col", "id", "--routing-key-col", "kind", "--delay-col", "wait",
        "--body-col", "payload", "--errors", str(tmp_path / "errors"), "--partitions", "3",
    ]
    code = main(command)
    out, err = capsys.readouterr()
    assert code == 1, err  # one rejected row fails the job, by default
    assert "publishing: 101/101 rows (100%)" in err
    assert "2s         100          0" in out  # the summary is printed all the same
    assert "rejected: 1 DelayTooLong" in out
    assert "delayq: error: 1 of 101 rows were rejected (1 DelayTooLong)" in err
    assert f"they are in {tmp_path / 'errors'}" in err and "--max-rejected" in err
    [line] = [
        json.loads(line)
        for part in (tmp_path / "errors").glob("part-*")
        for line in part.read_text().splitlines()
    ]
    assert (line["key"], line["error"], line["delay"]) == ("100", "DelayTooLong", "1d")
    # Expected rejections: the same job (its published rows duplicates only) passes
    assert main([*command, "--max-rejected", "1%"]) == 0, capsys.readouterr().err
    capsys.readouterr()

    records = tmp_path / "records"
    records.mkdir()
    (records / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in generated()))
    code = main(
        ["spark", "report", str(records), "--out", str(tmp_path / "report"), "--ladder",
         "1s 2s 4s", "--max-tiers", "2"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "1,200 records (0 skipped)" in out
    assert "current ladder: 1s 2s 4s" in out
    # Issue 29: the default grid's shortest tier (15s) serves delays of 1-4 s far worse
    # than the current ladder: no recommendation, and the warning says why.
    assert "recommended ladder:" not in out
    assert "serves the delays seen worse than the current one" in err and "--grid" in err
    assert (tmp_path / "report" / "report.md").exists()
    code = main(
        ["spark", "report", str(records), "--out", str(tmp_path / "report"), "--ladder",
         "1s 2s 4s", "--grid", "1s 2s 4s 15s"]
    )
    out, err = capsys.readouterr()
    assert code == 0 and "recommended ladder: " in out, err

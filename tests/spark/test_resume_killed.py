"""``--resume`` (issue 48): the same input is known again in another session, whatever
its format (Parquet's plan hash was not), and a changed one is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from delayq.errors import InvalidInput
from delayq.spark._inputs import input_columns
from delayq.spark._run_record import RunRecord, input_identity, resume_plan
from tests.spark_jvm import SUBMIT_ARGS

SCHEMA = "key string, routing_key string, delay string, body string"
PARTITIONS = 20
PER = 500
ROWS = PARTITIONS * PER
KILL_AT = 10
"""The partition whose task kills the job, once that many others were confirmed whole."""


def _write_inputs(spark: Any, root: Path) -> dict[str, tuple[str, Path]]:
    """One small input per format: (Spark format, path)."""
    rows = [(f"k{n}", "job.a", "1h", str(n)) for n in range(40)]
    df = spark.createDataFrame(rows, SCHEMA)
    df.repartition(3).write.parquet(str(root / "parquet"))
    df.repartition(2).write.orc(str(root / "orc"))
    df.coalesce(1).write.option("header", "true").csv(str(root / "csv"))
    folder = root / "jsonl"
    folder.mkdir()
    for part in range(3):
        (folder / f"part-{part}.json").write_text(
            "".join(
                json.dumps({"key": f"k{n}", "routing_key": "job.a", "delay": "1h", "body": n})
                + "\n"
                for n in range(part * 10, part * 10 + 10)
            )
        )
    return {
        "parquet": ("parquet", root / "parquet"),
        "orc": ("orc", root / "orc"),
        "csv": ("csv", root / "csv"),
        "jsonl folder": ("json", folder),
        "jsonl file": ("json", folder / "part-0.json"),
    }


def _identity(spark: Any, fmt: str, path: Path, **options: str) -> dict[str, Any]:
    reader = spark.read.options(**options)
    if fmt == "csv":
        reader = reader.option("header", "true")
    df = reader.format(fmt).load(str(path))
    selected = input_columns(df, "key", "routing_key", "delay", None, "body")
    return input_identity(df, selected)


_IDENTITIES = """
import json, sys
from pathlib import Path
from delayq.spark import local_session
from tests.spark.test_resume_killed import _identity

inputs = json.loads(sys.argv[1])
spark = local_session("local[1]", app_name="delayq-identity-test", ui=False)
spark.sparkContext.setLogLevel("ERROR")
try:
    print(json.dumps({name: _identity(spark, fmt, Path(path)) for name, (fmt, path) in
                      inputs.items()}))
finally:
    spark.stop()
"""


def _refused(before: dict[str, Any], now: dict[str, Any]) -> str:
    """The reason a resume of a run of input ``before`` is refused for input ``now``."""
    record = RunRecord.start(before, dry_run=False, resumed_from=None, errors_format="json")
    with pytest.raises(InvalidInput) as caught:
        resume_plan(record, now, "errors")
    return str(caught.value)


def test_the_same_input_read_in_another_session_is_the_same_and_a_changed_one_is_not(
    spark: Any, tmp_path: Path
) -> None:
    inputs = _write_inputs(spark, tmp_path)
    # Read once by another Spark session (another process), as a killed run's was.
    done = subprocess.run(
        [sys.executable, "-c", _IDENTITIES,
         json.dumps({name: (fmt, str(path)) for name, (fmt, path) in inputs.items()})],
        capture_output=True, text=True, timeout=240, cwd=Path(__file__).parents[2],
        env={**os.environ, **SUBMIT_ARGS},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    then = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (fmt, path) in inputs.items():
        now = _identity(spark, fmt, path)
        assert now == then[name], name
        record = RunRecord.start(then[name], dry_run=False, resumed_from=None, errors_format="json")
        resume_plan(record, now, "errors")  # accepted: no InvalidInput

    # A file added, removed, rewritten; another schema; other reader options.
    fmt, parquet = inputs["parquet"]
    before = _identity(spark, fmt, parquet)
    first = sorted(parquet.glob("part-*.parquet"))[0]
    shutil.copy(first, parquet / "part-99999-added.parquet")
    assert f"{(parquet / 'part-99999-added.parquet').as_uri()} was not read then" in _refused(
        before, _identity(spark, fmt, parquet)
    )
    (parquet / "part-99999-added.parquet").unlink()
    first.unlink()
    assert f"{first.as_uri()} is no longer read" in _refused(before, _identity(spark, fmt, parquet))

    fmt, folder = inputs["jsonl folder"]
    before = _identity(spark, fmt, folder)
    rewritten = folder / "part-1.json"
    rewritten.write_text(rewritten.read_text().replace('"1h"', '"2h"'))
    os.utime(rewritten, ns=(time.time_ns(), time.time_ns() + 10**9))  # another mtime, surely
    assert f"{rewritten.as_uri()} changed: " in _refused(before, _identity(spark, fmt, folder))

    fmt, single = inputs["jsonl file"]
    before = _identity(spark, fmt, single)
    assert "its schema changed: " in _refused(
        before, _identity(spark, fmt, single, primitivesAsString="true")
    )
    assert "another source, reader options or columns" in _refused(
        before, _identity(spark, fmt, single, allowComments="true")
    )

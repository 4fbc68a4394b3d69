"""``delayq spark schedule`` through ``spark-submit`` on a real standalone cluster: a master
and two workers started from the installed PySpark (:class:`delayq.local.spark.LocalSparkCluster`),
workers whose ``python3`` has no delayq, the executors' environment shipped as a packed venv
(``delayq spark pack-env``, ``--archives``), a real broker.

The documented commands, as a user runs them (docs/guides/spark.md, "Running on a cluster").
The driver runs this checkout's delayq (``PYTHONPATH``); Spark hands that path to the
executors too, so the shipped venv must bring every dependency (the misuse test shows a
``python3`` without them fails with one clear line).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq.local.spark import QUICK_JVM, LocalSparkCluster, spark_home
from delayq.sync import apply_topology
from tests.amqp import depth
from tests.waiting import wait_for

from .outputs import read_errors

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
pytestmark = pytest.mark.timeout(900)  # the first test also starts the cluster and packs the env


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    return {**env, **extra}


def _delayq_spark(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq.spark", *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )


class Cluster:
    def __init__(self, spark: LocalSparkCluster, archive: Path, entry: str) -> None:
        self.spark, self.archive, self.entry = spark, archive, entry

    def submit(self, *args: str, ship: bool = True) -> subprocess.CompletedProcess[str]:
        """``spark-submit`` of the entry point, the driver on this interpreter; with ``ship``
        the executors run the packed venv, else the workers' own ``python3``."""
        shipped = (
            ["--archives", f"{self.archive}#env", "--conf", "spark.pyspark.python=./env/bin/python"]
            if ship
            else []
        )
        return subprocess.run(
            [
                str(spark_home() / "bin" / "spark-submit"),
                "--master", self.spark.master_url,
                "--executor-memory", "512m",
                "--driver-memory", "512m",
                "--conf", f"spark.driver.extraJavaOptions={QUICK_JVM}",
                "--conf", f"spark.executor.extraJavaOptions={QUICK_JVM}",
                "--conf", "spark.log.level=WARN",
                "--conf", f"spark.pyspark.driver.python={sys.executable}",
                *shipped,
                self.entry,
                *args,
            ],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=600,
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster, while the executors' venv is packed beside it (cached for the module)."""
    base = tmp_path_factory.mktemp("spark-cluster")
    archive = base / "env.tar.gz"
    packed: list[subprocess.CompletedProcess[str]] = []
    packing = threading.Thread(
        target=lambda: packed.append(_delayq_spark("pack-env", str(archive), "--source", str(ROOT)))
    )
    packing.start()
    # The workers' python3 is a bare venv's: no delayq, no pika, no pydantic.
    bare = base / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    path = f"{bare / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    spark = LocalSparkCluster(workers=2, cores=1, memory="1g", base_dir=base / "spark",
                              worker_env={"PATH": path})
    try:
        spark.start(timeout_s=240)
        packing.join()
        [done] = packed
        assert done.returncode == 0, done.stderr
        assert archive.exists()
        entry = _delayq_spark("submit-path")
        assert entry.returncode == 0, entry.stderr
        yield Cluster(spark, archive, entry.stdout.strip())
    finally:
        packing.join()
        spark.stop()
    assert not spark.processes


@pytest.fixture
def job(rabbitmq_url: str, make_topology: Any, tmp_path: Path) -> dict[str, Any]:
    """A topology applied and written to a file, and a JSON-lines input of 300 valid rows
    and 2 invalid ones."""
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    topo_file = tmp_path / "topology.yaml"
    topo_file.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    rows: list[dict[str, Any]] = [
        {"id": n, "kind": "job.a", "wait": "0s", "payload": {"n": n}} for n in range(300)
    ]
    rows += [
        {"id": 300, "kind": "job.a", "wait": "1d", "payload": {"n": 300}},
        {"id": 301, "kind": "job.a", "wait": "soon", "payload": {"n": 301}},
    ]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [
        "schedule", str(source), "--file", str(topo_file), "--url", str(rabbitmq_url),
        "--key-col", "id", "--routing-key-col", "kind", "--delay-col", "wait",
        "--body-col", "payload", "--errors", str(tmp_path / "errors"), "--partitions", "4",
    ]
    return {"args": args, "work": f"{topology.namespace}.work", "errors": tmp_path / "errors"}


def test_spark_submit_on_a_standalone_cluster_with_and_without_the_packed_env(
    cluster: Cluster, job: dict[str, Any], rabbitmq_url: str
) -> None:
    """One test (one cluster, also under xdist): without the packed env first (the workers'
    own python3), then with it."""
    # Without the env: the executors' python3 lacks delayq's dependencies
    done = cluster.submit(*job["args"], "--max-rejected", "2", ship=False)
    out = done.stdout  # spark-submit passes the driver's stdout and stderr on as its stdout
    assert done.returncode == 1, out[-3000:] + done.stderr[-3000:]
    [error] = [line for line in out.splitlines() if line.startswith("delayq: error:")]
    assert "the executors' Python" in error and "cannot import" in error
    assert "No module named 'pika'" in error
    assert "pack-env" in error and "--archives" in error
    assert "Traceback" not in out
    assert "Spark UI: http://" in out  # the UI is on unless --no-ui
    assert depth(rabbitmq_url, job["work"]) == 0  # checked before any row was read
    assert not job["errors"].exists()

    # With the env
    done = cluster.submit(*job["args"], "--max-rejected", "2", "--no-ui")
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert re.search(r"^ +immediate +300 ", out, re.M), out[-3000:]
    assert re.search(r"^ +total +300 +2$", out, re.M)
    assert "1 DelayTooLong" in out and "1 InvalidDelay" in out
    assert "Traceback" not in out
    assert "Spark UI" not in out  # --no-ui
    # the master is spark-submit's; a local --errors path on it: right here (one
    # machine), said anyway
    assert "is a local path while the master is spark://127.0.0.1:" in out
    rejected = read_errors(job["errors"])
    assert sorted((r["key"], r["error"]) for r in rejected) == [
        ("300", "DelayTooLong"),
        ("301", "InvalidDelay"),
    ]
    wait_for(lambda: depth(rabbitmq_url, job["work"]) == 300, 60, "the 300 valid rows")
    assert depth(rabbitmq_url, job["work"]) == 300  # exactly the valid rows, no more


# --- without a cluster -------------------------------------------------------------------------


def test_submit_path_is_the_entry_point_and_runs_as_a_script_like_python_m() -> None:
    from delayq.spark._cluster import entry_point

    printed = _delayq_spark("submit-path")
    assert printed.returncode == 0, printed.stderr
    assert Path(printed.stdout.strip()) == entry_point() == SRC / "delayq/spark/__main__.py"
    # spark-submit runs the file as a script: its directory (schedule.py, cancel.py, ...) is
    # not left first on sys.path, and the commands are delayq spark's
    code = "import runpy, sys; sys.argv = [sys.argv[0], 'submit-path']; "
    as_script = subprocess.run(
        [sys.executable, str(entry_point()), "schedule", "--help"],
        capture_output=True, text=True, env=_env(), timeout=120,
    )
    assert as_script.returncode == 0, as_script.stderr
    assert "--no-ui" in as_script.stdout and "--master" in as_script.stdout
    probe = subprocess.run(
        [sys.executable, "-c", code + f"runpy.run_path({str(entry_point())!r}, "
         "run_name='__main__')"],
        capture_output=True, text=True, env=_env(), timeout=120,
    )
    assert probe.stdout.strip() == str(entry_point()), probe.stderr


def test_pack_env_refuses_a_bad_archive_name_or_source(tmp_path: Path) -> None:
    done = _delayq_spark("pack-env", str(tmp_path / "env.zip"))
    assert done.returncode == 2
    assert "must be a .tar.gz or .tgz" in done.stderr and "Traceback" not in done.stderr
    done = _delayq_spark("pack-env", str(tmp_path / "no" / "env.tar.gz"))
    assert done.returncode == 2 and "no such directory" in done.stderr
    done = _delayq_spark("pack-env", str(tmp_path / "env.tar.gz"), "--source", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "pip install" in done.stderr and "failed" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "env.tar.gz").exists()


@pytest.mark.parametrize(
    ("master", "errors", "warned"),
    [
        ("local[2]", "out/rejected", False),
        ("local", "file:///tmp/rejected", False),
        ("spark://h:7077", "out/rejected", True),
        ("spark://h:7077", "file:///mnt/rejected", True),
        ("spark://h:7077", "hdfs:///out/rejected", False),
        ("yarn", "s3a://bucket/rejected", False),
        ("yarn", None, False),
    ],
)
def test_a_local_errors_path_is_warned_about_on_a_cluster_master(
    master: str, errors: str | None, warned: bool
) -> None:
    from delayq.spark._cluster import errors_path_warning

    warning = errors_path_warning(master, errors)
    assert (warning is not None) == warned
    if warning:
        assert "shared storage" in warning and master in warning



def test_a_cluster_that_cannot_start_stops_what_it_started(tmp_path: Path) -> None:
    from delayq.local.spark import LocalSparkError

    spark = LocalSparkCluster(workers=1, memory="lots", base_dir=tmp_path / "spark")
    with pytest.raises(LocalSparkError, match="a Spark daemon exited"):
        spark.start(timeout_s=240)
    assert not spark.processes  # the master it had started is stopped too


def test_the_executors_check_names_the_cause_of_a_failed_probe() -> None:
    from delayq.spark._cluster import _why

    java = (
        "An error occurred while calling o1.collect.\n: org.apache.spark.SparkException: Job "
        "aborted\n\tat org.apache.spark...\nCaused by: java.io.IOException: Cannot run program "
        '"/nope/python": error=2, No such file or directory\n\tat java.lang...\nCaused by: '
        "java.io.IOException: error=2, No such file or directory\n"
    )
    assert _why(java) == (
        'java.io.IOException: Cannot run program "/nope/python": error=2, No such file or '
        "directory"
    )
    python = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "worker.py", line 1\nPySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in '
        "worker has different version (3, 10) than that in driver 3.11\n\tat org...\n"
    )
    assert _why(python) == (
        "PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in worker has different "
        "version (3, 10) than that in driver 3.11"
    )
    assert _why("nothing recognisable") is None

"""What a failed Spark job's error says: its cause in one line, whatever shape Spark's
exception text has (delayq.spark._failure.cause_line; no Spark needed)."""

from __future__ import annotations

import pytest

from delayq.spark._failure import cause_line

PY4J = "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        (  # a user's UDF raising: the Python line of the task's traceback
            PY4J + ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 3 "
            "in stage 5.0 failed 1 times, most recent failure: Lost task 3.0 in stage 5.0 (TID "
            "40) (10.0.0.1 executor driver): org.apache.spark.api.python.PythonException: "
            'Traceback (most recent call last):\n  File "x.py", line 1, in made\n'
            "RuntimeError: injected failure reading k7999\n\n\tat org.apache.spark.Foo(F.scala:1)",
            "RuntimeError: injected failure reading k7999",
        ),
        (  # a Python worker killed: the task failure Spark names
            PY4J + ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 2 "
            "in stage 5.0 failed 1 times, most recent failure: Lost task 2.0 in stage 5.0 (TID "
            "39) (10.0.0.1 executor driver): org.apache.spark.SparkException: Python worker "
            "exited unexpectedly (crashed)\n\tat org.apache.spark.api.python.BasePythonRunner"
            "\nCaused by: java.io.EOFException\n\tat java.base/java.io.DataInputStream",
            "Python worker exited unexpectedly (crashed)",
        ),
        (  # no task named: the stage failure
            PY4J + ": org.apache.spark.SparkException: Job aborted due to stage failure: "
            "Total size of serialized results is bigger than spark.driver.maxResultSize",
            "Total size of serialized results is bigger than spark.driver.maxResultSize",
        ),
        (  # cancelled: the first error line that is not py4j's own
            PY4J + ": org.apache.spark.SparkException: Job 12 cancelled as part of cancellation "
            "of all jobs\n\tat org.apache.spark.scheduler.DAGScheduler",
            "Job 12 cancelled as part of cancellation of all jobs",
        ),
        ("", "RuntimeError"),
    ],
)
def test_the_cause_is_one_readable_line(text: str, cause: str) -> None:
    assert cause_line(RuntimeError(text)) == cause


def test_a_long_cause_is_cut() -> None:
    said = cause_line(RuntimeError("ValueError: " + "x" * 1000), limit=50)
    assert len(said) == 50 and said.endswith("...")

"""The JVM options of the tests' own Spark drivers (the session of tests/conftest.py, and
the processes some Spark tests start): C1 only, serial GC.

A driver JVM of the tests lives for seconds to minutes on two shared cores, where the
optimising compiler's and a parallel GC's threads cost more than they return: one
``local[2]`` session started in 11 s with Java's defaults and in 5 s with these, and its
first small job ran 6-7 s instead of 7-9. The options change how fast the JVM gets
going, not what Spark does. (Executors on a standalone cluster: see test_cluster.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from delayq.local.spark import QUICK_JVM

SUBMIT_ARGS = {"PYSPARK_SUBMIT_ARGS": f'--driver-java-options "{QUICK_JVM}" pyspark-shell'}
"""The environment that makes PySpark start its driver JVM with :data:`QUICK_JVM`
(PySpark passes ``$PYSPARK_SUBMIT_ARGS`` to the ``spark-submit`` that launches it)."""


@contextmanager
def quick_driver() -> Iterator[None]:
    """While a session is created in this process: its JVM with :data:`QUICK_JVM`."""
    saved = os.environ.get("PYSPARK_SUBMIT_ARGS")
    os.environ.update(SUBMIT_ARGS)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = saved

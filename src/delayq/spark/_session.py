"""The Spark session delayq's jobs run in, and the check that PySpark is installed."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import TYPE_CHECKING

from delayq.errors import MissingExtra

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["in_spark_worker", "local_session", "require_pyspark", "under_spark_submit"]


def in_spark_worker() -> bool:
    """Whether this interpreter is a Spark executor's Python worker (``pyspark.daemon`` or
    ``pyspark.worker`` runs it), not a driver."""
    # Spark's worker factory hands every Python worker (forked by the daemon or not) this
    # secret; a driver has PYSPARK_GATEWAY_SECRET instead.
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return "PYTHON_WORKER_FACTORY_SECRET" in os.environ or getattr(main, "name", "") in (
        "pyspark.daemon",
        "pyspark.worker",
    )


def under_spark_submit() -> bool:
    """Whether ``spark-submit`` (or ``pyspark``) started this driver: it hands the driver a
    running JVM through ``PYSPARK_GATEWAY_PORT``, and the master and configuration with it."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def require_pyspark() -> None:
    """Raise :class:`~delayq.errors.MissingExtra` (an ImportError) naming the
    ``delayq[spark]`` extra when PySpark or matplotlib is missing.

    An executor's Python worker needs PySpark only (Spark puts its own on the worker's
    path): matplotlib draws the report on the driver, so a packed executor environment
    (``delayq spark pack-env``) leaves it out.
    """
    for module in ("pyspark", "matplotlib"):
        if module == "matplotlib" and in_spark_worker():
            continue
        if importlib.util.find_spec(module) is None:
            raise MissingExtra("delayq.spark", "spark", module)


def local_session(
    master: str | None = None,
    *,
    app_name: str = "delayq",
    shuffle_partitions: int | None = None,
    ui: bool | None = None,
) -> SparkSession:
    """The active Spark session, or a new one (``master`` default ``local[*]``).

    Under ``spark-submit`` the master and the configuration come from the submit command
    (``--master``, ``--conf``, ``spark.pyspark.python``): only what is passed here
    overrides them. Otherwise the Python workers run this interpreter, so they import
    the same delayq. ``ui``: ``False`` turns the Spark UI off, ``True`` on; ``None`` (the
    default) leaves Spark's own setting (on, unless ``spark.ui.enabled`` says otherwise).
    The console progress bar is always off: delayq prints its own progress.
    """
    from pyspark.sql import SparkSession

    submitted = under_spark_submit()
    if not submitted:
        # Under spark-submit the executors' Python is spark.pyspark.python's (or
        # PYSPARK_PYTHON's, else python3 on each worker): the driver's own path means
        # nothing on another machine.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    builder = SparkSession.builder.appName(app_name)
    if master is not None or not submitted:
        builder = builder.master(master or "local[*]")
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if ui is not None:
        builder = builder.config("spark.ui.enabled", "true" if ui else "false")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    return builder.getOrCreate()

"""The Spark session delayq's jobs run in, and the check that PySpark is installed."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import TYPE_CHECKING

from delayq.errors import MissingExtra

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["local_session", "require_pyspark"]


def require_pyspark() -> None:
    """Raise :class:`~delayq.errors.MissingExtra` (an ImportError) naming the
    ``delayq[spark]`` extra when PySpark or matplotlib is missing."""
    for module in ("pyspark", "matplotlib"):
        if importlib.util.find_spec(module) is None:
            raise MissingExtra("delayq.spark", "spark", module)


def local_session(
    master: str | None = None, *, app_name: str = "delayq", shuffle_partitions: int | None = None
) -> SparkSession:
    """The active Spark session, or a new one (``master`` default ``local[*]``).

    Under ``spark-submit`` the master comes from the submit command; locally the
    Python workers run this interpreter, so they import the same delayq.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    builder = SparkSession.builder.appName(app_name)
    # Under spark-submit (which hands the driver a running JVM through
    # PYSPARK_GATEWAY_PORT) the master comes from the submit command.
    if master is not None or "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master(master or "local[*]")
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    builder = builder.config("spark.ui.enabled", "false").config(
        "spark.ui.showConsoleProgress", "false"
    )
    return builder.getOrCreate()

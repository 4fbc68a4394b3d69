"""delayq on Spark (PySpark): bulk scheduling (batch and streaming) and cancelling from
DataFrames, and delivery analytics.

Needs the ``spark`` extra (``pip install 'delayq[spark]'``): PySpark, and
matplotlib for the report's plots. Importing :mod:`delayq` never needs them.

>>> from delayq.spark import schedule, report            # doctest: +SKIP
>>> summary = schedule(df, url=url, topology=topology, key_col="id",
...                    routing_key_col="kind", delay_col="delay", body_col="payload",
...                    errors_path="out/errors")              # doctest: +SKIP
>>> summary.published                                    # doctest: +SKIP
{'1m': 120000, '5m': 80000}
"""

from __future__ import annotations

from delayq.spark._session import require_pyspark

require_pyspark()

from delayq.spark._cluster import check_executors  # noqa: E402
from delayq.spark._session import local_session  # noqa: E402
from delayq.spark.cancel import CancelSummary, cancel_from_dataframe  # noqa: E402
from delayq.spark.report import ReportSummary, report  # noqa: E402
from delayq.spark.schedule import ScheduleSummary, schedule  # noqa: E402
from delayq.spark.stream import BatchSummary, ScheduleStream, schedule_stream  # noqa: E402

__all__ = [
    "BatchSummary",
    "CancelSummary",
    "ReportSummary",
    "ScheduleStream",
    "ScheduleSummary",
    "cancel_from_dataframe",
    "check_executors",
    "local_session",
    "report",
    "schedule",
    "schedule_stream",
]

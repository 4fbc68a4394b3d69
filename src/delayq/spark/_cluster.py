"""Running delayq's Spark jobs on a cluster: the ``spark-submit`` entry point, the check
that the executors' Python can run delayq, and the warning for a local errors path."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from delayq.errors import ExecutorEnvironment

__all__ = [
    "CLUSTER_DOCS",
    "check_executors",
    "entry_point",
    "errors_path_warning",
    "is_local_master",
]

CLUSTER_DOCS = "see 'Running on a cluster' in the Spark guide (docs/guides/spark.md)"

# Runs in the executors' Python: only the standard library, pickled by value (its module
# is no importable one), so it reports a missing delayq instead of failing to unpickle.
_PROBE_SOURCE = '''
def probe(_rows):
    import sys
    missing = []
    for name in ("delayq", "pika", "pydantic_core", "aio_pika", "yaml"):
        try:
            __import__(name)
        except Exception as exc:
            missing.append("%s (%s: %s)" % (name, type(exc).__name__, exc))
    version = None
    if not missing:
        import delayq
        version = delayq.__version__
    yield (sys.executable, "%d.%d" % sys.version_info[:2], version, missing)
'''
_PYTHON_ERROR = re.compile(r"^(\w+(?:Error|Exception)): (.+)$", re.M)
_JAVA_CAUSE = re.compile(r"^Caused by: ([\w.$]+): (.+)$", re.M)


def entry_point() -> Path:
    """The file ``spark-submit`` runs: ``delayq/spark/__main__.py`` of this install."""
    return Path(__file__).with_name("__main__.py")


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs the executors in the driver's process (``local``, ``local[4]``)."""
    return master == "local" or master.startswith("local[") or master.startswith("local-")


def errors_path_warning(master: str, errors_path: str | None) -> str | None:
    """A warning when ``errors_path`` is a local one (no scheme, or ``file:``) while the
    executors may run on other machines: every executor writes its rejected rows there
    and the driver reads them back, so it must be shared storage (HDFS, S3, NFS)."""
    if errors_path is None or is_local_master(master):
        return None
    if "://" in errors_path and not errors_path.startswith("file:"):
        return None
    return (
        f"--errors {errors_path} is a local path while the master is {master}: every "
        "executor writes its rejected rows there and the driver reads them back, so it must "
        "be shared storage (hdfs://, s3a://, or a path mounted on every machine, e.g. NFS); "
        "a local path is right only when every worker runs on this machine"
    )


def _probe() -> Any:
    namespace: dict[str, Any] = {"__name__": "delayq_executor_probe"}
    exec(compile(_PROBE_SOURCE, "<delayq executor probe>", "exec"), namespace)
    return namespace["probe"]


def _why(text: str) -> str | None:
    """The cause in a failed job's text: the Python worker's last error, else Java's root
    cause (``java.io.IOException: Cannot run program "./env/bin/python"``)."""
    causes = _JAVA_CAUSE.findall(text)
    for name, message in causes:  # the first names the program: the outer cause
        if message.startswith("Cannot run program"):
            return f"{name}: {message}".strip()
    found = _PYTHON_ERROR.findall(text) or causes
    return ": ".join(found[-1]).strip() if found else None


def check_executors(spark: Any) -> None:
    """Run one small task on the executors and raise :class:`ExecutorEnvironment` naming
    what their Python lacks (delayq, a dependency, the driver's Python version), instead
    of the job failing later with a long traceback. Nothing to check on a local master."""
    context = spark.sparkContext
    if is_local_master(context.master):
        return
    slices = max(1, int(context.defaultParallelism))
    context.setJobGroup("delayq-probe", "delayq: checking the executors' Python")
    try:
        answers = context.parallelize(range(slices), slices).mapPartitions(_probe()).collect()
    except Exception as exc:  # Py4JJavaError: the worker could not even start
        why = _why(str(exc)) or type(exc).__name__
        raise ExecutorEnvironment(
            f"the executors' Python cannot run delayq's tasks: {why}. Ship an environment "
            "(delayq spark pack-env, then spark-submit --archives ENV.tar.gz#env --conf "
            f"spark.pyspark.python=./env/bin/python); {CLUSTER_DOCS}"
        ) from None
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    driver = f"{sys.version_info.major}.{sys.version_info.minor}"
    for executable, version, delayq_version, missing in answers:
        if missing:
            raise ExecutorEnvironment(
                f"the executors' Python ({executable}, Python {version}) cannot import "
                f"{', '.join(missing)}: ship an environment with delayq (delayq spark "
                "pack-env ENV.tar.gz, then spark-submit --archives ENV.tar.gz#env --conf "
                f"spark.pyspark.python=./env/bin/python); {CLUSTER_DOCS}"
            )
        if version != driver:
            raise ExecutorEnvironment(
                f"the executors run Python {version} ({executable}), the driver {driver}: "
                "pack the environment with the driver's Python minor version"
            )
        from delayq import __version__

        if delayq_version != __version__:
            raise ExecutorEnvironment(
                f"the executors' Python ({executable}) has delayq {delayq_version}, the "
                f"driver {__version__}: pack the environment again"
            )

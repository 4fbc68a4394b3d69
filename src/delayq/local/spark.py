"""A throwaway Spark standalone cluster (a master and workers) from the installed PySpark.

The pip ``pyspark`` ships ``bin/spark-class`` but not ``sbin/start-master.sh`` or
``start-worker.sh``: the master and each worker run as ``spark-class
org.apache.spark.deploy.master.Master`` / ``...worker.Worker``, each in a session of its
own, on 127.0.0.1 and free ports, with a scratch directory (logs, the workers' work
directories, an empty ``SPARK_CONF_DIR``). :meth:`LocalSparkCluster.stop` signals only
the process groups this object started (by their PIDs): a worker's group holds the
executor JVMs and Python workers it launched.

>>> with LocalSparkCluster(workers=2) as cluster:     # doctest: +SKIP
...     print(cluster.master_url)                    # spark://127.0.0.1:<port>
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from delayq.local.node import free_port
from delayq.local.reaper import unwatch, watch

__all__ = ["QUICK_JVM", "LocalSparkCluster", "LocalSparkError", "spark_home"]

QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""JVM options for short-lived daemons on a small machine: the quick JIT only, one GC
thread (less CPU at start than the defaults; pass ``java_options=""`` to measure)."""


class LocalSparkError(RuntimeError):
    """The local Spark cluster could not be found, started or stopped."""


def spark_home() -> Path:
    """``$SPARK_HOME``, else the installed PySpark's directory (the pip package is one)."""
    explicit = os.environ.get("SPARK_HOME")
    if explicit:
        return Path(explicit)
    try:
        import pyspark
    except ImportError as exc:
        raise LocalSparkError("no SPARK_HOME and no PySpark installed") from exc
    return Path(pyspark.__file__).parent


class LocalSparkCluster:
    """A standalone master and ``workers`` workers of ``cores`` cores and ``memory`` each.

    ``worker_env``: more environment for the workers (their executors inherit it);
    ``java_options``: the master's and workers' JVM options (``SPARK_DAEMON_JAVA_OPTS``).
    """

    def __init__(
        self,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        daemon_memory: str = "256m",
        java_options: str = QUICK_JVM,
        base_dir: str | Path | None = None,
        worker_env: dict[str, str] | None = None,
    ) -> None:
        self.workers, self.cores, self.memory = workers, cores, memory
        self.daemon_memory, self.java_options = daemon_memory, java_options
        self.worker_env = dict(worker_env or {})
        self._own_dir = base_dir is None
        self.dir = Path(base_dir or tempfile.mkdtemp(prefix="delayq-spark-"))
        self.port, self.web_port = free_port(), free_port()
        self.processes: list[subprocess.Popen[bytes]] = []
        self.home = spark_home()

    def __repr__(self) -> str:
        return f"LocalSparkCluster({self.master_url}, workers={self.workers})"

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        conf = self.dir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "SPARK_CONF_DIR": str(conf),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "SPARK_DAEMON_JAVA_OPTS": self.java_options,
            **extra,
        }

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.out", "wb") as out:
            self.processes.append(
                subprocess.Popen(
                    [str(self.home / "bin" / "spark-class"), *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=self.dir,
                    start_new_session=True,
                )
            )
        watch(self.processes[-1].pid)  # ends with this process, however it ends

    def status(self) -> dict[str, object]:
        """The master's own view (its web UI's ``/json/``): status, alive workers, apps."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as answer:
            found: dict[str, object] = json.load(answer)
        return found

    def start(self, timeout_s: float = 120.0) -> LocalSparkCluster:
        """Start the master, then the workers; return once every worker is ALIVE (else
        stop what was started and raise :class:`LocalSparkError`)."""
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise LocalSparkError("no Java runtime (java on PATH or JAVA_HOME) for Spark")
        try:
            return self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout_s: float) -> LocalSparkCluster:
        self._spawn(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", str(self.web_port)],
            self._env({}),
        )
        for n in range(self.workers):
            work = self.dir / f"worker-{n}"
            work.mkdir(parents=True, exist_ok=True)
            self._spawn(
                f"worker-{n}",
                ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--webui-port", str(free_port()), "--cores", str(self.cores),
                 "--memory", self.memory, "--work-dir", str(work), self.master_url],
                self._env(self.worker_env),
            )
        deadline = time.monotonic() + timeout_s
        while True:
            for process in self.processes:
                if process.poll() is not None:
                    raise LocalSparkError(f"a Spark daemon exited: {self._tail()}")
            try:
                state = self.status()
                if state.get("status") == "ALIVE" and state.get("aliveworkers") == self.workers:
                    return self
            except (OSError, ValueError):
                pass  # the master's web UI is not up yet, or answers before its JSON is
            if time.monotonic() > deadline:
                raise LocalSparkError(
                    f"the Spark cluster was not up after {timeout_s:.0f} s: {self._tail()}"
                )
            time.sleep(0.5)

    def _tail(self, lines: int = 8) -> str:
        found = []
        for log in sorted((self.dir / "logs").glob("*.out")):
            text = log.read_text(errors="replace").strip().splitlines()[-lines:]
            found.append(f"{log.name}: " + "\n".join(text))
        return "\n".join(found)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the workers (and the executors they launched), then the master: SIGTERM to
        each process group started here, SIGKILL to one that outlives ``timeout_s``."""
        for process in reversed(self.processes):
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
            try:  # what is left of its group: executors, Python workers
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if process.poll() is None:
                process.wait(timeout=10)
            unwatch(process.pid)
        self.processes.clear()

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

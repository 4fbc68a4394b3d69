"""The JVM options of a short-lived Spark driver a test starts for a batch job: C1 only,
serial GC (the cluster test's spark-submit drivers use the same).

Such a JVM lives for seconds on two shared cores, where the optimising compiler's and a
parallel GC's threads cost more than they return: a ``local[2,2]`` session started in
11 s with Java's defaults and in 5-7 s with these; its first small job ran 6-7 s instead
of 7-9. Used only there: the shared session and the stream CLI's processes keep Java's
defaults (with these, one run failed the stream SIGKILL test with "Multiple streaming
queries are concurrently using" the checkpoint on the restart; not investigated).
"""

from __future__ import annotations

from delayq.local.spark import QUICK_JVM

SUBMIT_ARGS = {"PYSPARK_SUBMIT_ARGS": f'--driver-java-options "{QUICK_JVM}" pyspark-shell'}
"""The environment that makes PySpark start its driver JVM with :data:`QUICK_JVM`
(PySpark passes ``$PYSPARK_SUBMIT_ARGS`` to the ``spark-submit`` that launches it)."""

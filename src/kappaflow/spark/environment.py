"""What a Spark driver process needs in its environment, decided before its JVM starts.

Without PySpark: the job manager uses it in the CLI process, which starts drivers and
needs no JVM of its own.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from kappaflow.settings import Settings

LOOPBACK = "127.0.0.1"


def spark_environment(settings: Settings, current: Mapping[str, str]) -> dict[str, str]:
    """Environment variables a Spark driver process needs, beyond ``current``'s.

    SparkContext reads the Python workers' interpreter from ``PYSPARK_PYTHON`` when it
    is created (spark.pyspark.python does not reach every runner, e.g. transformWithState's).
    With a local master, ``SPARK_LOCAL_IP`` keeps every server of the JVM (driver, block
    manager, UI) on loopback; the JVM reads it at start, before any Spark option. A value
    the user set is kept.
    """
    wanted = {"PYSPARK_PYTHON": sys.executable}
    if is_local_master(settings.spark.master):
        wanted["SPARK_LOCAL_IP"] = LOOPBACK
    return {key: value for key, value in wanted.items() if key not in current}


def is_local_master(master: str) -> bool:
    return master == "local" or master.startswith("local[")

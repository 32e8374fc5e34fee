"""The engine's JVM half: the Java operators and writers the job API's plans call.

The sources are under ``java/io/kappaflow/engine``; setup compiles them into
``kappaflow-engine.jar`` (``kappaflow.install.engine``), which every Spark session of
kappaflow loads (``spark.jars``, so a cluster's executors get it too). Python reaches a
class through the gateway PySpark holds (``jvm_engine``).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from kappaflow.errors import JarBuildError

#: The plans' contract with the jar (``io.kappaflow.engine.Engine.CONTRACT``).
CONTRACT = 1


def jvm_engine(spark: SparkSession) -> Any:
    """The ``io.kappaflow.engine`` package on ``spark``'s JVM, checked to be the jar this
    package plans for."""
    engine = spark.sparkContext._jvm.io.kappaflow.engine  # type: ignore[union-attr]
    try:
        found = int(engine.Engine.contract())
    except Exception:
        raise JarBuildError(
            "the Spark session has no kappaflow-engine.jar on its class path: "
            "run `make setup` (sessions kappaflow builds load it)"
        ) from None
    if found != CONTRACT:
        raise JarBuildError(
            f"kappaflow-engine.jar implements contract {found}, this kappaflow plans for "
            f"{CONTRACT}: run `make setup` to build it again"
        )
    return engine

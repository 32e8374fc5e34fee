"""Which window operator a query's checkpoint holds the state of, Python's or the engine's
Java one: they keep it in different layouts (streams/ops/windowing.py and
session_windows.py; the Java sources in streams/jvm), which the state readers tell apart
by Spark's operator metadata.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from kappaflow.streams.ops.windowing import ENGINES
from kappaflow.streams.output.lake_fs import HadoopFs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: In a query's checkpoint: ``{"windows": "python" | "jvm"}``.
RECORD = "kappaflow-operator.json"
#: Spark's name, in its state metadata, for a Java (Scala) transformWithState operator.
JAVA_OPERATOR = "transformWithStateExec"


def checkpoint_engine(spark: SparkSession, checkpoint: str) -> str | None:
    """The window operator whose state a query's checkpoint holds: the recorded one, else
    the one Spark's state metadata names; None if neither says (no state yet)."""
    recorded = _recorded(HadoopFs(spark, checkpoint), "")
    if recorded is not None:
        return recorded
    metadata = spark.read.format("state-metadata").load(checkpoint).collect()
    operators = [str(row["operatorName"]) for row in metadata]
    if not operators:
        return None
    return "jvm" if JAVA_OPERATOR in operators else "python"


def _recorded(fs: HadoopFs, query: str) -> str | None:
    path = f"{query}/{RECORD}".lstrip("/")
    if not fs.exists(path):
        return None
    engine = json.loads(fs.read_text(path)).get("windows")
    return engine if engine in ENGINES else None

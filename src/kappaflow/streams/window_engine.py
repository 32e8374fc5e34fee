"""Which window operator a query runs, Python's or the engine's Java one: a checkpoint
keeps the one it was started with.

The two keep their state in different layouts (streams/ops/windowing.py and
session_windows.py; the Java sources in streams/jvm), so a checkpoint one made cannot be
resumed by the other. When a window query starts on a checkpoint that has planned no
batch yet, the session's ``spark.kappaflow.windows.engine`` picks the operator and the
choice is recorded in the checkpoint (``RECORD``: copied with it into a savepoint, gone
with it when it is deleted); a later start resumes with the recorded operator, whatever
the session says. A checkpoint made before the record existed is read for the operator
its state is of (Spark's operator metadata), and then recorded.

Beside it, ``AGGREGATES`` records the aggregates the operator's state holds, bound to
their columns' types (whether a sum is integral, which quantiles a sketch estimates),
for reading the state back without the job's code (jobs/state_read.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kappaflow.streams.aggregates import Aggregate
from kappaflow.streams.ops.windowing import ENGINES, configured_engine, describe_aggregates
from kappaflow.streams.output.lake_fs import HadoopFs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: In a query's checkpoint: ``{"windows": "python" | "jvm"}``.
RECORD = "kappaflow-operator.json"
#: In a window query's checkpoint: its aggregates, ``describe_aggregates``'s list.
AGGREGATES = "kappaflow-aggregates.json"
#: Spark's name, in its state metadata, for a Java (Scala) transformWithState operator.
JAVA_OPERATOR = "transformWithStateExec"


def window_engine(spark: SparkSession, checkpoint_root: str, query: str) -> str:
    """The window operator query ``query`` (its checkpoint ``<checkpoint_root>/<query>``)
    runs: its checkpoint's if it has started, else the session's; recorded either way."""
    fs = HadoopFs(spark, checkpoint_root)
    started = any(e.name.isdigit() for e in fs.children(f"{query}/offsets"))
    engine = checkpoint_engine(spark, fs.uri(query)) if started else None
    # Started with no record and no state metadata: a checkpoint made under the old
    # default, which was Python's.
    engine = engine or ("python" if started else configured_engine(spark))
    if _recorded(fs, query) != engine:
        fs.write_atomically(f"{query}/{RECORD}", json.dumps({"windows": engine}) + "\n")
    return engine


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


def record_aggregates(
    spark: SparkSession,
    checkpoint_root: str,
    query: str,
    names: Sequence[str],
    bound: Sequence[Aggregate],
) -> None:
    """Record in query ``query``'s checkpoint the aggregates its window state holds."""
    fs = HadoopFs(spark, checkpoint_root)
    text = json.dumps(describe_aggregates(names, bound)) + "\n"
    path = f"{query}/{AGGREGATES}"
    if not fs.exists(path) or fs.read_text(path) != text:
        fs.write_atomically(path, text)


def recorded_aggregates(spark: SparkSession, checkpoint: str) -> list[dict[str, Any]] | None:
    """The aggregates a window query's checkpoint records (None: started before the
    record existed)."""
    fs = HadoopFs(spark, checkpoint)
    if not fs.exists(AGGREGATES):
        return None
    found: list[dict[str, Any]] = json.loads(fs.read_text(AGGREGATES))
    return found

"""Reading a counting job's own state through Spark's state data source.

For debugging, and for checking the serving store against the state: this reads what
the job's checkpoint holds for its last committed batch, without disturbing the job. A
counting job's state is its ``counts`` aggregate's (streams/ops/windowing.py for fixed
windows, streams/ops/session_windows.py for sessions): per window and shard, or per shard
of keys, an Arrow table of every key's partials and version. The engine's Java operators
(streams/ops/jvm_state.py) keep the same per key in their own layout: per window and
shard a map from key to accumulators, or per shard of keys the sessions held.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pyarrow as pa

import kappaflow as kf
from kappaflow.counting.job import OUTPUT
from kappaflow.counting.spec import CountSpec
from kappaflow.counting.store import WindowCount
from kappaflow.errors import NoCommittedStateError
from kappaflow.jobs.manager import JobManager
from kappaflow.settings import Settings
from kappaflow.streams.ops.arrow_ipc import table_from_ipc
from kappaflow.streams.ops.jvm_state import (
    SESSIONS,
    WINDOW_FINAL,
    WINDOW_KEYS,
    read_accumulators,
    read_sessions,
)
from kappaflow.streams.ops.windowing import values_json
from kappaflow.streams.window_engine import checkpoint_engine

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession


def read_state(settings: Settings, job: str) -> list[WindowCount]:
    from kappaflow.spark.session import build_session

    record = JobManager(settings).get(job)
    spec = CountSpec.from_params(record.params)
    checkpoint = (settings.checkpoint_root / job / OUTPUT).resolve()
    if not (checkpoint / "commits").exists():
        raise NoCommittedStateError(f"job {job!r} has no committed state yet in {checkpoint}")
    spark = build_session(settings, app_name=f"kappaflow:state:{job}")
    return read_counts(spark, str(checkpoint), window_ms=spec.window_ms)


def read_counts(
    spark: SparkSession, checkpoint: str, *, window_ms: int | None
) -> list[WindowCount]:
    """The windows a count's query (checkpoint ``checkpoint``) holds as of its last
    committed batch, whichever operator keeps them (streams/window_engine.py); windows of
    ``window_ms``, or sessions (None)."""
    jvm = checkpoint_engine(spark, checkpoint) == "jvm"
    if window_ms is None:
        windows = _java_sessions(spark, checkpoint) if jvm else _python_sessions(spark, checkpoint)
    elif jvm:
        windows = _java_windows(spark, checkpoint, window_ms)
    else:
        windows = _python_windows(spark, checkpoint, window_ms)
    return sorted(windows, key=lambda w: (w.key, w.window_start))


def _state(spark: SparkSession, checkpoint: str, variable: str) -> list[Row]:
    return (
        spark.read.format("statestore")
        .option("path", checkpoint)
        .option("stateVarName", variable)
        .load()
        .collect()
    )


def _python_windows(spark: SparkSession, checkpoint: str, size_ms: int) -> list[WindowCount]:
    """The Python operator's state: per window and shard, an Arrow table of every key's
    partials and version, and whether the window is final."""
    windows: list[WindowCount] = []
    for row in _state(spark, checkpoint, "window"):
        held = table_from_ipc(row["value"]["partials"])
        start = int(row["key"]["window_start"])
        final = bool(row["value"]["final"])
        windows.extend(
            WindowCount(json.loads(key)[0], start, start + size_ms, count, version, final)
            for key, count, version in zip(
                held["key"].to_pylist(), _counts(held), held["version"].to_pylist(), strict=True
            )
        )
    return windows


def _python_sessions(spark: SparkSession, checkpoint: str) -> list[WindowCount]:
    """The Python operator's state: per shard of keys, an Arrow table of the sessions it
    holds, with their partials and versions."""
    windows: list[WindowCount] = []
    for row in _state(spark, checkpoint, SESSIONS):
        held = table_from_ipc(row["value"]["sessions"])
        windows.extend(
            WindowCount(json.loads(key)[0], start, end, count, version, final)
            for key, start, end, count, version, final in zip(
                held["key"].to_pylist(),
                held["start"].to_pylist(),
                held["end"].to_pylist(),
                _counts(held),
                held["version"].to_pylist(),
                held["final"].to_pylist(),
                strict=True,
            )
        )
    return windows


def _counts(held: pa.Table) -> list[int]:
    """Each held key's count, from its partials as the job computes it."""
    return [json.loads(text)["count"] for text in values_json(["count"], [kf.count()], held)]


def _java_windows(spark: SparkSession, checkpoint: str, size_ms: int) -> list[WindowCount]:
    """The Java operator's state: per window and shard, a map from each key to its
    accumulators (the job's one aggregate, its count), and whether the window is final."""
    finals = {
        (int(row["key"]["_1"]), int(row["key"]["_2"])): bool(row["value"]["value"])
        for row in _state(spark, checkpoint, WINDOW_FINAL)
    }
    windows: list[WindowCount] = []
    for row in _state(spark, checkpoint, WINDOW_KEYS):
        start, shard = int(row["key"]["_1"]), int(row["key"]["_2"])
        held = read_accumulators(row["user_map_value"]["value"], 1)
        windows.append(
            WindowCount(
                json.loads(row["user_map_key"]["value"])[0],
                start,
                start + size_ms,
                held.values[0].counted,
                held.version,
                finals.get((start, shard), False),
            )
        )
    return windows


def _java_sessions(spark: SparkSession, checkpoint: str) -> list[WindowCount]:
    """The Java operator's state: per shard of keys, the sessions it holds."""
    windows: list[WindowCount] = []
    for row in _state(spark, checkpoint, SESSIONS):
        held, _ = read_sessions(row["value"]["value"], 1)
        windows.extend(
            WindowCount(
                json.loads(s.key)[0],
                s.start,
                s.end,
                s.accumulators.values[0].counted,
                s.version,
                s.final,
            )
            for s in held
        )
    return windows

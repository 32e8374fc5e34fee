"""Reading a counting job's own state through Spark's state data source.

For debugging, and for checking the serving store against the state: this reads what
the job's checkpoint holds for its last committed batch, without disturbing the job. A
counting job's state is its ``counts`` aggregate's (streams/ops/windowing.py for fixed
windows, streams/ops/session_windows.py for sessions): per window and shard, or per shard
of keys, an Arrow table of every key's partials and version.
"""

from __future__ import annotations

import json

import pyarrow as pa

import kappaflow as kf
from kappaflow.counting.job import OUTPUT
from kappaflow.counting.spec import CountSpec
from kappaflow.counting.store import WindowCount
from kappaflow.errors import NoCommittedStateError
from kappaflow.jobs.manager import JobManager
from kappaflow.settings import Settings
from kappaflow.streams.ops.arrow_ipc import table_from_ipc
from kappaflow.streams.ops.windowing import values_json


def read_state(settings: Settings, job: str) -> list[WindowCount]:
    from kappaflow.spark.session import build_session

    record = JobManager(settings).get(job)
    spec = CountSpec.from_params(record.params)
    checkpoint = (settings.checkpoint_root / job / OUTPUT).resolve()
    if not (checkpoint / "commits").exists():
        raise NoCommittedStateError(f"job {job!r} has no committed state yet in {checkpoint}")
    spark = build_session(settings, app_name=f"kappaflow:state:{job}")
    sessions = spec.session_gap_ms is not None
    frame = (
        spark.read.format("statestore")
        .option("path", str(checkpoint))
        .option("stateVarName", "sessions" if sessions else "window")
        .load()
    )
    windows: list[WindowCount] = []
    for row in frame.collect():
        if sessions:
            held = table_from_ipc(row["value"]["sessions"])
            starts, ends = held["start"].to_pylist(), held["end"].to_pylist()
            finals = held["final"].to_pylist()
        else:
            held = table_from_ipc(row["value"]["partials"])
            start = int(row["key"]["window_start"])
            starts = [start] * held.num_rows
            ends = [start + spec.size_ms] * held.num_rows
            finals = [bool(row["value"]["final"])] * held.num_rows
        windows.extend(
            WindowCount(json.loads(key)[0], start, end, count, version, final)
            for key, start, end, count, version, final in zip(
                held["key"].to_pylist(),
                starts,
                ends,
                _counts(held),
                held["version"].to_pylist(),
                finals,
                strict=True,
            )
        )
    return sorted(windows, key=lambda w: (w.key, w.window_start))


def _counts(held: pa.Table) -> list[int]:
    """Each held key's count, from its partials as the job computes it."""
    return [json.loads(text)["count"] for text in values_json(["count"], [kf.count()], held)]

"""Reading a counting job's own state through Spark's state data source.

For debugging, and for checking the serving store against the state: this reads what
the job's checkpoint holds for its last committed batch, without disturbing the job.
The windows are read as any job's are (jobs/state_read.py, whichever operator keeps
them); what is the counting job's own is their shape here, ``WindowCount``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import kappaflow as kf
from kappaflow.counting.job import OUTPUT
from kappaflow.counting.spec import CountSpec
from kappaflow.counting.store import WindowCount
from kappaflow.errors import NoCommittedStateError
from kappaflow.jobs.manager import JobManager
from kappaflow.jobs.state_read import window_state
from kappaflow.settings import Settings
from kappaflow.streams.ops.windowing import describe_aggregates

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The counting job's one aggregate, for a checkpoint that records none.
_COUNT = describe_aggregates(["count"], [kf.count()])
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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
    rows = window_state(spark, checkpoint, size_ms=window_ms, aggregates=_COUNT)
    windows = [_count(row) for row in rows]
    return sorted(windows, key=lambda w: (w.key, w.window_start))


def _count(row: dict[str, Any]) -> WindowCount:
    """A window of state_read's rows as the counting job's: its one key and its count."""
    return WindowCount(
        row["key"][0],
        _epoch_ms(row["window_start"]),
        _epoch_ms(row["window_end"]),
        int(row["values"]["count"]),
        int(row["version"]),
        bool(row["final"]),
    )


def _epoch_ms(text: str) -> int:
    # Exact: the text has milliseconds, which a float's seconds may round.
    return (datetime.fromisoformat(text) - _EPOCH) // timedelta(milliseconds=1)

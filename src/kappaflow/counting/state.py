"""Reading a counting job's own state through Spark's state data source.

For debugging, and for checking the serving store against the state: this reads what
the job's checkpoint holds for its last committed batch, without disturbing the job.
"""

from __future__ import annotations

from kappaflow.counting.spec import CountSpec
from kappaflow.counting.store import WindowCount
from kappaflow.errors import JobError
from kappaflow.settings import Settings
from kappaflow.spark.jobs import JobManager


def read_state(settings: Settings, job: str) -> list[WindowCount]:
    from kappaflow.spark.session import build_session

    record = JobManager(settings).get(job)
    spec = CountSpec.from_params(record.params)
    checkpoint = (settings.checkpoint_root / job / "count").resolve()
    if not (checkpoint / "commits").exists():
        raise JobError(f"job {job!r} has no committed state yet in {checkpoint}")
    spark = build_session(settings.model_copy(update={}), app_name=f"kappaflow:state:{job}")
    frame = (
        spark.read.format("statestore")
        .option("path", str(checkpoint))
        .option("stateVarName", "window")
        .load()
    )
    windows = [
        WindowCount(
            key=str(row["key"]["key"]),
            window_start=int(row["key"]["window_start"]),
            window_end=int(row["key"]["window_start"]) + spec.size_ms,
            count=int(row["value"]["count"]),
            version=int(row["value"]["version"]),
            final=bool(row["value"]["final"]),
        )
        for row in frame.collect()
    ]
    return sorted(windows, key=lambda w: (w.key, w.window_start))

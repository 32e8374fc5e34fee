"""Reading a counting job's own state through Spark's state data source.

For debugging, and for checking the serving store against the state: this reads what
the job's checkpoint holds for its last committed batch, without disturbing the job.
"""

from __future__ import annotations

from kappaflow.counting.sessions import decode_sessions
from kappaflow.counting.spec import QUERY, CountSpec
from kappaflow.counting.store import WindowCount
from kappaflow.counting.windows import decode_counts
from kappaflow.errors import NoCommittedStateError
from kappaflow.jobs.manager import JobManager
from kappaflow.settings import Settings


def read_state(settings: Settings, job: str) -> list[WindowCount]:
    from kappaflow.spark.session import build_session

    record = JobManager(settings).get(job)
    spec = CountSpec.from_params(record.params)
    checkpoint = (settings.checkpoint_root / job / QUERY).resolve()
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
            held = decode_sessions(row["value"]["sessions"]).to_dict("records")
            windows.extend(
                WindowCount(
                    str(s["key"]),
                    int(s["start"]),
                    int(s["end"]),
                    int(s["count"]),
                    int(s["version"]),
                    bool(s["final"]),
                )
                for s in held
            )
            continue
        start = int(row["key"]["window_start"])
        counts = decode_counts(row["value"]["counts"])
        final = bool(row["value"]["final"])
        windows.extend(
            WindowCount(
                str(name),
                start,
                start + spec.size_ms,
                int(values["count"]),
                int(values["version"]),
                final,
            )
            for name, values in counts.iterrows()
        )
    return sorted(windows, key=lambda w: (w.key, w.window_start))

"""The driver process of one job: ``python -m kappaflow.spark.runner --kappaflow-job=DIR``.

It builds the session, starts the pipeline's queries, records ``running``, then watches:
SIGTERM or SIGINT stops the queries (each finishes or abandons its batch cleanly and the
checkpoint stays consistent), a failed query ends the job as ``failed``, and queries that
end by themselves (available-now) end it as ``finished``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from kappaflow.errors import KappaflowError
from kappaflow.spark.jobs import JobRecord
from kappaflow.timeutil import iso

POLL_S = 0.5


def main(argv: list[str]) -> int:
    prefix = "--kappaflow-job="
    job_arg = next((arg for arg in argv if arg.startswith(prefix)), None)
    if job_arg is None:
        print("usage: python -m kappaflow.spark.runner --kappaflow-job=DIR", file=sys.stderr)
        return 2
    home = Path(job_arg[len(prefix) :])
    record_path = home / "job.json"
    record = JobRecord.load(record_path)
    record.pid = os.getpid()
    record.save(record_path)
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        print(f"received signal {signum}: stopping", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        return _run(record, record_path, home, stop)
    except KappaflowError as exc:
        _finish(record, record_path, "failed", f"error[{exc.code}]: {exc}")
        print(f"error[{exc.code}]: {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:
        traceback.print_exc()
        _finish(record, record_path, "failed", f"{type(exc).__name__}: {exc}".splitlines()[0])
        return 1


def _run(record: JobRecord, record_path: Path, home: Path, stop: threading.Event) -> int:
    from kappaflow.pipelines import get_pipeline
    from kappaflow.pipelines.base import JobContext
    from kappaflow.settings import load_settings
    from kappaflow.spark.session import build_session

    config_file = Path(record.config_file) if record.config_file else None
    settings = load_settings(config_file, **record.overrides)
    spark = build_session(settings, app_name=f"kappaflow:{record.name}")
    ctx = JobContext(record.name, record.params, spark, settings)
    queries = get_pipeline(record.pipeline)(ctx)
    record.state = "running"
    record.save(record_path)
    print(f"job {record.name} running: {len(queries)} queries", flush=True)
    progress_path = home / "progress.json"
    last_written = ""
    logged: dict[str, int] = {}
    while not stop.wait(POLL_S):
        _log_batches(queries, logged)
        snapshot = json.dumps(
            {q.name or q.id: q.lastProgress for q in queries if q.lastProgress}, default=str
        )
        if snapshot != last_written:
            # Atomic, so that `jobs`, `demo` and status readers never see half a file.
            scratch = progress_path.with_suffix(".tmp")
            scratch.write_text(snapshot)
            scratch.replace(progress_path)
            last_written = snapshot
        failed = [q for q in queries if not q.isActive and q.exception() is not None]
        if failed:
            error = str(failed[0].exception()).splitlines()[0]
            for query in queries:
                query.stop()
            _finish(record, record_path, "failed", error)
            return 1
        if all(not q.isActive for q in queries):
            _finish(record, record_path, "finished", None)
            return 0
    for query in queries:
        query.stop()
    _finish(record, record_path, "stopped", None)
    spark.stop()
    return 0


def _log_batches(queries: list[Any], logged: dict[str, int]) -> None:
    """One driver.log line per finished batch of each query: where its time went."""
    for query in queries:
        name = query.name or query.id
        for progress in query.recentProgress:
            batch = progress.batchId
            if batch <= logged.get(name, -1):
                continue
            logged[name] = batch
            durations = " ".join(
                f"{step}={ms}" for step, ms in sorted(progress.durationMs.items()) if ms
            )
            print(
                f"progress {name} batch {batch}: {progress.numInputRows} rows; ms {durations}",
                flush=True,
            )


def _finish(record: JobRecord, path: Path, state: str, error: str | None) -> None:
    record.state = state
    record.error = error
    record.ended_at = iso(datetime.now(UTC))
    record.save(path)
    print(f"job {record.name} {state}" + (f": {error}" if error else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

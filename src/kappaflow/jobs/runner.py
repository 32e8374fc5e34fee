"""The driver process of one job: ``python -m kappaflow.jobs.runner --kappaflow-job=DIR``.

It builds the session, starts the pipeline's queries and the job's parts (jobs/parts.py),
records ``running``, then watches: SIGTERM or SIGINT stops the parts and the queries
(each finishes or abandons its batch cleanly and the checkpoint stays consistent), a
failed query or part ends the job as ``failed``, and queries that end by themselves
(available-now) end it as ``finished``. A savepoint asked of the job (`jobs savepoint`)
stops the queries as a stop does, is taken, and the queries start again.

With ``--kappaflow-part=NAME`` it is the driver of one part of the job instead: the
same, for the part's queries only, recording its state beside the job's, and stopping
when the job's main driver is gone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from kappaflow.errors import KappaflowError, UnknownPartError
from kappaflow.jobs.contract import JobContext, Pipeline
from kappaflow.jobs.files import write_atomically
from kappaflow.jobs.manager import JobRecord, JobState
from kappaflow.jobs.parts import PART_ARG, PartProcesses, write_part_state
from kappaflow.jobs.pipeline import load_pipeline
from kappaflow.jobs.restarts import MAX_RESTARTS, RESTART_PAUSE_S, failures, restartable
from kappaflow.jobs.savepoints import answer_savepoint, savepoint_asked
from kappaflow.timeutil import iso

if TYPE_CHECKING:
    from kappaflow.settings import Settings, SettingsOverrides

POLL_S = 0.5
#: How long a part's queries may take to start (a new JVM, Python workers, the source).
PART_START_TIMEOUT_S = 150.0
#: How long a part may take to stop its queries when the job stops.
PART_STOP_TIMEOUT_S = 30.0
#: How long a savepoint waits for the job's queries to be between batches before it
#: stops them in one: a batch takes seconds, a job that never rests runs them back to back.
SAVEPOINT_QUIET_S = 30.0
#: How long a stopped job waits for the batches under way to end (within the stop's
#: timeout, jobs/manager.py STOP_TIMEOUT_S).
STOP_QUIET_S = 20.0


def main(argv: list[str]) -> int:
    prefix = "--kappaflow-job="
    job_arg = next((arg for arg in argv if arg.startswith(prefix)), None)
    if job_arg is None:
        print("usage: python -m kappaflow.jobs.runner --kappaflow-job=DIR", file=sys.stderr)
        return 2
    home = Path(job_arg[len(prefix) :])
    part = next((arg[len(PART_ARG) :] for arg in argv if arg.startswith(PART_ARG)), None)
    record_path = home / "job.json"
    record = JobRecord.load(record_path)
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        print(f"received signal {signum}: stopping", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    if part is not None:
        return _run_part(record, home, part, stop)
    record.pid = os.getpid()
    record.save(record_path)
    try:
        return _run(record, record_path, home, stop)
    except KappaflowError as exc:
        _finish(record, record_path, JobState.FAILED, f"error[{exc.code}]: {exc}")
        print(f"error[{exc.code}]: {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:
        traceback.print_exc()
        _finish(record, record_path, JobState.FAILED, _first_line(exc))
        return 1


def _settings(record: JobRecord, part: SettingsOverrides | None = None) -> Settings:
    """The job's settings; a part's overrides go over the job's own."""
    from kappaflow.settings import load_settings

    overrides = part.over(record.overrides) if part is not None else record.overrides
    config_file = Path(record.config_file) if record.config_file else None
    return load_settings(config_file, overrides)


def _run(record: JobRecord, record_path: Path, home: Path, stop: threading.Event) -> int:
    from kappaflow.spark.environment import spark_environment
    from kappaflow.spark.session import build_session

    pipeline = _pipeline(record)
    settings = _settings(record)
    spark = None
    start: Callable[[], list[Any]] = list
    if pipeline.main:
        spark = build_session(settings, app_name=f"kappaflow:{record.name}")
        start = partial(
            pipeline.start, JobContext(record.name, record.params, spark, settings, stopping=stop)
        )
    else:
        # Every query runs in a part: no session (no JVM) here; the parts' drivers get the
        # environment a session would have set.
        os.environ.update(spark_environment(settings, os.environ))
    queries = start()
    parts = PartProcesses(home, pipeline.parts(record.params, settings))
    # A stop asked while the queries started: no parts, and the job never runs.
    if not stop.is_set():
        try:
            parts.start(timeout=PART_START_TIMEOUT_S)
        except BaseException:
            parts.stop(timeout=PART_STOP_TIMEOUT_S)
            raise
        record.state = JobState.RUNNING
        record.save(record_path)
        print(f"job {record.name} running: {len(queries)} queries, parts {parts.names}", flush=True)
    restarts = 0
    while True:
        state, error = _watch(
            queries, stop, home / "progress.json", parts.failure, lambda: savepoint_asked(home)
        )
        if state is JobState.RUNNING:
            # A savepoint is asked for: the queries stop as at a stop, which leaves their
            # checkpoint and sinks consistent with each other; it is copied, and they start
            # again from it (jobs/savepoints.py).
            _between_batches(queries, stop)
            for query in queries:
                query.stop()
            answer_savepoint(settings, home, record.name)
            if stop.is_set():
                state, error = JobState.STOPPED, None
                break
            queries = start()
            continue
        if (
            state is not JobState.FAILED
            or restarts >= MAX_RESTARTS
            or not restartable(failures(queries))
        ):
            break
        restarts += 1
        print(
            f"job {record.name}: {error}: restarting its queries from their checkpoints "
            f"({restarts} of {MAX_RESTARTS})",
            flush=True,
        )
        for query in queries:
            query.stop()
        if stop.wait(RESTART_PAUSE_S):
            state, error = JobState.STOPPED, None
            break
        queries = start()
    if state is JobState.STOPPED:
        # A stop lets the batch under way finish (its sinks' writes are done by then, its
        # checkpoint commits): a start goes on from where the sinks are.
        _between_batches(queries, threading.Event(), STOP_QUIET_S)
    parts.stop(timeout=PART_STOP_TIMEOUT_S)
    for query in queries:
        query.stop()
    _finish(record, record_path, state, error)
    if state is JobState.STOPPED and spark is not None:
        spark.stop()
    return 1 if state is JobState.FAILED else 0


def _between_batches(
    queries: list[Any], stop: threading.Event, quiet_s: float = SAVEPOINT_QUIET_S
) -> None:
    """Wait until no query runs a batch, at most ``quiet_s``. A query stopped in a
    batch abandons it, as at a stop: the checkpoint stays consistent and the batch runs
    again, but the sinks it reached keep their part of it (the store its statistics),
    which a start from the savepoint with changed code would not compute anew. Between
    batches, a stop leaves nothing half done (but for a trigger that fires in between)."""
    deadline = time.monotonic() + quiet_s
    while time.monotonic() < deadline and not stop.is_set():
        if not any(q.isActive and q.status["isTriggerActive"] for q in queries):
            return
        time.sleep(0.05)


def _run_part(record: JobRecord, home: Path, part: str, stop: threading.Event) -> int:
    """The driver of one part of the job: its queries, until stopped or orphaned."""
    from kappaflow.spark.session import build_session

    parent = os.getppid()

    def watch_parent() -> None:
        while not stop.wait(POLL_S):
            if os.getppid() != parent:
                print("the job's main driver is gone: stopping", flush=True)
                stop.set()

    threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()
    try:
        pipeline = _pipeline(record)
        settings = _settings(record)
        spec = next((p for p in pipeline.parts(record.params, settings) if p.name == part), None)
        if spec is None:
            raise UnknownPartError(
                f"pipeline {record.pipeline!r} has no part {part!r} for these params"
            )
        settings = _settings(record, spec.settings)
        spark = build_session(settings, app_name=f"kappaflow:{record.name}:{part}")
        ctx = JobContext(record.name, record.params, spark, settings, part=part, stopping=stop)
        queries = pipeline.start(ctx)
    except Exception as exc:
        traceback.print_exc()
        write_part_state(home, part, JobState.FAILED, _first_line(exc))
        return 1
    write_part_state(home, part, JobState.RUNNING)
    print(f"job {record.name} part {part} running: {len(queries)} queries", flush=True)
    state, error = _watch(queries, stop, home / f"progress.{part}.json", lambda: None)
    for query in queries:
        query.stop()
    write_part_state(home, part, state, error)
    print(f"job {record.name} part {part} {state}" + (f": {error}" if error else ""), flush=True)
    if state is JobState.STOPPED:
        spark.stop()
    return 1 if state is JobState.FAILED else 0


def _watch(
    queries: list[Any],
    stop: threading.Event,
    progress_path: Path,
    failure: Callable[[], str | None],
    asked: Callable[[], bool] = lambda: False,
) -> tuple[JobState, str | None]:
    """Log batches and keep ``progress_path`` current until ``stop`` is set ("stopped"),
    a query fails or ``failure`` names one ("failed", why), every query has ended by
    itself ("finished"), or ``asked`` says a savepoint is asked for ("running")."""
    last_written = ""
    logged: dict[str, int] = {}
    while not stop.wait(POLL_S):
        # One progress a query a poll: each is the JVM's JSON of it, parsed here.
        last = {q.name or q.id: (q, q.lastProgress) for q in queries}
        _log_batches(last, logged)
        snapshot = json.dumps(
            {name: p for name, (_q, p) in last.items() if p is not None}, default=str
        )
        if snapshot != last_written:
            write_atomically(progress_path, snapshot)
            last_written = snapshot
        failed = [q for q in queries if not q.isActive and q.exception() is not None]
        if failed:
            return JobState.FAILED, str(failed[0].exception()).splitlines()[0]
        other = failure()
        if other is not None:
            return JobState.FAILED, other
        # A job whose queries all run in parts (``Pipeline.main`` False) has none here: it
        # runs until stopped.
        if queries and all(not q.isActive for q in queries):
            return JobState.FINISHED, None
        if asked():
            return JobState.RUNNING, None
    return JobState.STOPPED, None


def _log_batches(last: dict[str, tuple[Any, Any]], logged: dict[str, int]) -> None:
    """One driver.log line per finished batch of each query: where its time went. A
    query's recent progress is read only when more than its last batch is new."""
    for name, (query, progress) in last.items():
        if progress is None or progress.batchId <= logged.get(name, -1):
            continue
        done = [progress]
        if progress.batchId > logged.get(name, -1) + 1:
            done = query.recentProgress
        for each in done:
            if each.batchId > logged.get(name, -1):
                logged[name] = each.batchId
                print(_batch_line(name, each), flush=True)


def _batch_line(name: str, progress: Any) -> str:
    durations = " ".join(f"{step}={ms}" for step, ms in sorted(progress.durationMs.items()) if ms)
    operators = "".join(
        f"; {op.operatorName} {op.numRowsTotal} keys, updates {op.allUpdatesTimeMs} ms,"
        f" commit {op.commitTimeMs} ms"
        for op in progress.stateOperators
    )
    rows = progress.numInputRows
    return f"progress {name} batch {progress.batchId}: {rows} rows; ms {durations}{operators}"


def _pipeline(record: JobRecord) -> Pipeline:
    """The job's pipeline, in real-time mode where it was started so."""
    if record.real_time:
        return load_pipeline(record.pipeline, real_time=True)
    return load_pipeline(record.pipeline)


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _finish(record: JobRecord, path: Path, state: JobState, error: str | None) -> None:
    record.state = state
    record.error = error
    record.ended_at = iso(datetime.now(UTC))
    record.save(path)
    print(f"job {record.name} {state}" + (f": {error}" if error else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

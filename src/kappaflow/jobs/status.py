"""A job's status and accounting: what ``jobs status`` prints and a service reads.

Per output: its last batch and running totals (events passed, duplicates dropped, late
events, dead letters, Kafka records and lake rows written), as its batch writer recorded
them after the batch's transaction committed (writer.py); the events read, measured from
the offsets in Spark's checkpoint up to that batch, over every Kafka source of the query
(both streams of a join; spark/checkpoint.py); and the query's
last progress: watermark, rows per second, batch duration, state rows and memory, and
how far behind the source's latest offsets it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kappaflow.jobs.manager import JobManager
from kappaflow.settings import Settings
from kappaflow.spark.checkpoint import is_remote, offsets_consumed, shuffle_partitions


def job_status(settings: Settings, name: str) -> dict[str, Any]:
    """Everything known about job ``name``: its record, its outputs, their progress."""
    record = JobManager(settings).get(name)
    return {
        "job": name,
        "state": str(record.state),
        "pid": record.pid,
        "app": record.pipeline,
        "params": record.params,
        "started_at": record.started_at,
        "error": record.error,
        "outputs": outputs_status(settings, name),
    }


def outputs_status(settings: Settings, name: str) -> dict[str, Any]:
    """Per output of job ``name``: its accounting, the events its query read, its
    progress (what ``jobs status`` prints under ``outputs``)."""
    manager = JobManager(settings)
    progress = manager.progress(name)
    outputs: dict[str, Any] = {}
    folder = manager.job_dir(name) / "outputs"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        output = path.stem
        status = _json(path) or {}
        entry: dict[str, Any] = {
            "batch": status.get("batch_id"),
            "watermark_ms": status.get("watermark"),
            **status.get("totals", {}),
            "events_read": _events_read(settings, name, output, status),
            # Its shuffle and state partitions, as its checkpoint pins them (jobs rescale).
            "partitions": _partitions(settings, name, output),
            "updated_at": status.get("at"),
        }
        entry.update(query_progress(progress.get(f"{name}.{output}")))
        outputs[output] = entry
    return outputs


def _events_read(settings: Settings, job: str, output: str, status: dict[str, Any]) -> int | None:
    batch_id = status.get("batch_id")
    if batch_id is None:
        return None
    return events_read(settings, job, output, int(batch_id), status)


def events_read(
    settings: Settings,
    job: str,
    output: str,
    batch_id: int,
    status: dict[str, Any] | None = None,
) -> int | None:
    """Source offsets the output's query consumed through ``batch_id``, from every Kafka
    source it reads. A local checkpoint is measured here; one on HDFS or S3, which this
    process does not reach, by the job's driver after the batch: the output's status
    (``status``, else its file) has it (streams/output/writer.py). None where neither
    says, or the status is of another batch."""
    location = settings.checkpoint_location
    if is_remote(location):
        if status is None:
            status = _json(JobManager(settings).job_dir(job) / "outputs" / f"{output}.json")
        recorded = (status or {}).get("events_read")
        if recorded is None or (status or {}).get("batch_id") != batch_id:
            return None
        return int(recorded)
    query_dir = Path(location.removeprefix("file://").removeprefix("file:")) / job / output
    try:
        return offsets_consumed(query_dir, batch_id)
    except (OSError, IndexError, ValueError):
        return None


def _partitions(settings: Settings, job: str, output: str) -> int | None:
    """The output's shuffle and state partitions, from its local checkpoint's offset log
    (None for one on HDFS or S3, which this process does not reach)."""
    location = settings.checkpoint_location
    if is_remote(location):
        return None
    query_dir = Path(location.removeprefix("file://").removeprefix("file:")) / job / output
    try:
        return shuffle_partitions(query_dir)
    except (OSError, IndexError, ValueError):
        return None


def query_progress(last: dict[str, Any] | None) -> dict[str, Any]:
    """The figures ``jobs status`` shows from a query's last progress report."""
    if not last:
        return {}
    operators = last.get("stateOperators") or []
    # The partition furthest behind, of any Kafka source of the query (both of a join).
    behinds = [
        float(b)
        for source in last.get("sources") or []
        if (b := (source.get("metrics") or {}).get("maxOffsetsBehindLatest")) is not None
    ]
    behind = max(behinds) if behinds else None
    return {
        "input_rows_per_s": last.get("inputRowsPerSecond"),
        "processed_rows_per_s": last.get("processedRowsPerSecond"),
        "batch_duration_ms": (last.get("durationMs") or {}).get("triggerExecution"),
        "event_time_watermark": (last.get("eventTime") or {}).get("watermark"),
        "state_rows": sum(int(o.get("numRowsTotal") or 0) for o in operators),
        "state_memory_bytes": sum(int(o.get("memoryUsedBytes") or 0) for o in operators),
        "lag_records": int(behind) if behind is not None else None,
    }


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

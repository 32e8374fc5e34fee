"""A counting job's status: its accounting, measured two ways, and its progress.

``events_read`` is measured from what Spark's checkpoint says the job consumed from its
source, through the last batch applied to the store; ``accounted`` sums what the job's
own code did with each event (counted, dropped as a duplicate, late, dead letter). The
two are equal when no event was lost or counted twice. A transactional producer's commit
markers take source offsets too: on such a source ``events_read`` exceeds ``accounted``
by the number of markers. Events read again after a ``--from-time`` rewind or a failover
count in both, each time they are read (spark/checkpoint.py ``move_source``).
"""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import TopicPartition

from kappaflow.counting.job import OUTPUT
from kappaflow.counting.spec import REALTIME_PART, CountSpec
from kappaflow.counting.store import CountStats, CountStore
from kappaflow.jobs.manager import JobManager, JobRecord
from kappaflow.jobs.parts import part_state
from kappaflow.jobs.status import events_read as output_events_read
from kappaflow.kafka.clients import consumer
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings
from kappaflow.timeutil import from_epoch_ms, iso


def events_read(settings: Settings, name: str, stats: CountStats) -> int | None:
    """Source offsets the job consumed through the last batch applied to the store;
    None when the checkpoint no longer holds that batch's offsets."""
    if stats.last_batch < 0:
        return 0
    return output_events_read(settings, name, OUTPUT, stats.last_batch)


def count_status(settings: Settings, record: JobRecord) -> dict[str, Any]:
    """Everything ``kappaflow count status`` shows, as one JSON-ready object."""
    jobs = JobManager(settings)
    name = record.name
    stats = CountStore(redis_client(settings), name).stats()
    progress = jobs.progress(name).get(f"{name}.{OUTPUT}") or {}
    operators = progress.get("stateOperators") or [{}]
    parts = {}
    if CountSpec.from_params(record.params).realtime:
        parts["realtime"] = part_state(jobs.job_dir(name), REALTIME_PART)
    return {
        "name": name,
        "state": record.state,
        **parts,
        "events_read": events_read(settings, name, stats),
        "accounted": stats.accounted,
        "counted": stats.counted,
        "duplicates_dropped": stats.duplicates,
        "late": stats.late,
        "dead_letters": stats.dead_letters,
        "watermark": _watermark(progress, stats),
        "open_windows": stats.open_windows,
        "window_keys": stats.window_keys,
        "state_rows": sum(int(op.get("numRowsTotal", 0)) for op in operators),
        "state_bytes": sum(int(op.get("memoryUsedBytes", 0)) for op in operators),
        "last_batch": {
            "id": progress.get("batchId"),
            "at": progress.get("timestamp"),
            "input_rows": progress.get("numInputRows"),
            "duration_ms": (progress.get("durationMs") or {}).get("triggerExecution"),
        },
        "lag": _lag(settings, progress),
    }


def _watermark(progress: dict[str, Any], stats: CountStats) -> str | None:
    """The job's watermark: from its last progress, else the highest the store has seen."""
    from_progress = (progress.get("eventTime") or {}).get("watermark")
    if from_progress and not str(from_progress).startswith("1970"):
        return str(from_progress)
    return iso(from_epoch_ms(stats.watermark_ms)) if stats.watermark_ms > 0 else None


def _lag(settings: Settings, progress: dict[str, Any]) -> int | None:
    """Records in the source not yet read by the job (None before its first batch)."""
    sources = progress.get("sources") or []
    if not sources or not sources[0].get("endOffset"):
        return None
    offsets = json.loads(sources[0]["endOffset"])
    reader = consumer(settings.kafka)
    try:
        lag = 0
        for topic, partitions in offsets.items():
            for partition, done in partitions.items():
                _, high = reader.get_watermark_offsets(
                    TopicPartition(topic, int(partition)), timeout=settings.kafka.timeout_s
                )
                lag += max(0, high - int(done))
        return lag
    finally:
        reader.close()

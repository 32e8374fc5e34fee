"""A counting job going on from a point in time: on a new source, or on a backup cluster
after a failover (docs/deployment.md).

Spark keeps a job's source offsets in its checkpoint, not in a consumer group, so no
mirror translates them, and one cluster's offsets mean nothing on another. What a backup
keeps is each record's partition and timestamp, so a job goes on from a time: the offsets
of the first records stamped at or after it (Kafka's offsets-for-times).

A job that never ran starts there. A job that ran keeps its checkpoint, and with it its
state: its windows' counts, the ids each window has counted, its watermark. Only its
source offsets move, so it reads again what it read after that time, and each event read
again is dropped by its id (a duplicate) or, its window forgotten, reported late; it is
never counted twice. The time must be no later than the first record the job had not
read, or what lies between is skipped.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from confluent_kafka import KafkaException, TopicPartition

from kappaflow.errors import CheckpointRewindError, ConsumeError
from kappaflow.jobs.files import local_path
from kappaflow.jobs.manager import JobManager
from kappaflow.kafka.clients import consumer, describe
from kappaflow.kafka.topics import topic_partitions
from kappaflow.settings import Settings
from kappaflow.spark.checkpoint import last_committed, move_source
from kappaflow.timeutil import iso, to_epoch_ms


def offsets_at(settings: Settings, topic: str, when: datetime) -> dict[int, int]:
    """Per partition of ``topic``, the offset of its first record stamped at or after
    ``when`` (its end offset if it has none)."""
    kafka = settings.kafka
    partitions = topic_partitions(kafka, topic)
    reader = consumer(kafka)
    try:
        stamp = to_epoch_ms(when)
        found = reader.offsets_for_times(
            [TopicPartition(topic, p, stamp) for p in partitions], timeout=kafka.timeout_s
        )
        offsets: dict[int, int] = {}
        for tp in found:
            if tp.offset >= 0:
                offsets[tp.partition] = tp.offset
            else:
                _, high = reader.get_watermark_offsets(tp, timeout=kafka.timeout_s)
                offsets[tp.partition] = high
        return offsets
    except KafkaException as exc:
        raise ConsumeError(
            f"cannot look up offsets by time in {topic!r}: {describe(exc)}"
        ) from None
    finally:
        reader.close()


def checkpoint_dir(settings: Settings, name: str) -> Path | None:
    """Job ``name``'s checkpoint on this machine, None if it has none here; an error if
    it has one on another file system (its offsets cannot be moved from here)."""
    root = f"{settings.checkpoint_location.rstrip('/')}/{name}"
    path = local_path(root)
    if path is None:
        raise CheckpointRewindError(
            f"job {name!r} keeps its checkpoint at {root}, not on this machine: its offsets "
            "cannot be moved from here"
        )
    return path if path.is_dir() else None


def start_from(settings: Settings, name: str, topic: str, when: datetime) -> tuple[str, list[str]]:
    """Where job ``name`` reads ``topic`` from, given ``when``: the source's start (Spark's
    ``startingOffsets``, for a job without a checkpoint), and what was done to the
    checkpoint of a job that has one, one line per query. The job must be stopped."""
    if JobManager(settings).is_running(name):
        raise CheckpointRewindError(
            f"job {name!r} is running: stop it first (`kappaflow count stop {name}`)"
        )
    offsets = offsets_at(settings, topic, when)
    start = json.dumps({topic: {str(p): o for p, o in sorted(offsets.items())}})
    root = checkpoint_dir(settings, name)
    queries = sorted(p for p in root.iterdir() if (p / "offsets").is_dir()) if root else []
    for query in queries:
        if last_committed(query) is None:
            raise CheckpointRewindError(
                f"job {name!r} query {query.name!r} has committed no batch: nothing to go on "
                f"from (remove the job, and start it anew with --from-time {iso(when)})"
            )
    done = []
    for query in queries:
        batch = move_source(query, topic, offsets)
        where = ", ".join(f"{p}:{o}" for p, o in sorted(offsets.items()))
        done.append(f"{query.name}: after batch {batch}, {topic} from offsets {where}")
    return start, done

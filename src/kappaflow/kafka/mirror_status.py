"""What a mirror has done, read from the clusters themselves: its connectors' states (in
MirrorMaker's status topic on the backup), each mirrored partition's end offsets on both
clusters and the timestamp of the last record the backup holds, and the newest offset
translation of each consumer group (its checkpoints topic on the backup).

Every read tolerates a cluster that does not answer: after a failover the primary is
gone, and what the backup holds is then what matters.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaException, TopicPartition

from kappaflow.errors import KafkaClusterError, KappaflowError
from kappaflow.kafka.clients import cluster_metadata, consumer
from kappaflow.kafka.mirror import (
    CHECKPOINTS_TOPIC,
    INTERNAL_TOPICS,
    Mirror,
    connector_states,
    plan_or_settings,
)
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.settings import KafkaSettings
from kappaflow.timeutil import from_epoch_ms, iso


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    #: End offsets; None where that cluster does not answer.
    primary_end: int | None
    backup_end: int | None
    #: Epoch ms of the newest record the backup holds in the partition (None: none).
    mirrored_until_ms: int | None

    @property
    def lag(self) -> int | None:
        """Offsets the backup is behind. Exact for records written outside transactions;
        each transaction's commit marker takes an offset on the primary that the backup
        (which gets the committed records only) does not have."""
        if self.primary_end is None or self.backup_end is None:
            return None
        return max(0, self.primary_end - self.backup_end)

    def to_json(self) -> dict[str, Any]:
        until = self.mirrored_until_ms
        return {
            "topic": self.topic,
            "partition": self.partition,
            "primary_end": self.primary_end,
            "backup_end": self.backup_end,
            "lag": self.lag,
            "mirrored_until": iso(from_epoch_ms(until)) if until is not None else None,
        }


@dataclass(frozen=True)
class GroupCheckpoint:
    """One consumer group's committed offset on the primary, translated to the backup."""

    group: str
    topic: str
    partition: int
    upstream: int
    downstream: int
    #: When MirrorMaker wrote it (epoch ms).
    at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "topic": self.topic,
            "partition": self.partition,
            "primary_offset": self.upstream,
            "backup_offset": self.downstream,
            "at": iso(from_epoch_ms(self.at_ms)),
        }


def mirrored_partitions(
    primary: KafkaSettings, backup: KafkaSettings, topics: str
) -> tuple[list[PartitionLag], list[str]]:
    """Every partition of the topics ``topics`` matches that the backup holds, with end
    offsets on both clusters; and the clusters that did not answer."""
    wanted = re.compile(topics)
    unreachable: list[str] = []
    backup_topics = _topic_partitions(backup, wanted)
    if backup_topics is None:
        return [], ["backup"]
    primary_ends: dict[tuple[str, int], int] | None = None
    if _topic_partitions(primary, wanted) is None:
        unreachable.append("primary")
    else:
        primary_ends = _end_offsets(primary, backup_topics)
    backup_ends = _end_offsets(backup, backup_topics)
    found = []
    for topic, partitions in sorted(backup_topics.items()):
        for partition in partitions:
            where = (topic, partition)
            found.append(
                PartitionLag(
                    topic,
                    partition,
                    primary_ends.get(where) if primary_ends is not None else None,
                    backup_ends.get(where),
                    last_timestamp(backup, topic, partition),
                )
            )
    return found, unreachable


def _topic_partitions(kafka: KafkaSettings, wanted: re.Pattern[str]) -> dict[str, list[int]] | None:
    try:
        metadata = cluster_metadata(kafka)
    except KafkaClusterError:
        return None
    return {
        name: sorted(topic.partitions)
        for name, topic in metadata.topics.items()
        if wanted.fullmatch(name) and not INTERNAL_TOPICS.fullmatch(name)
    }


def _end_offsets(kafka: KafkaSettings, topics: dict[str, list[int]]) -> dict[tuple[str, int], int]:
    reader = consumer(kafka)
    ends: dict[tuple[str, int], int] = {}
    try:
        for topic, partitions in topics.items():
            for partition in partitions:
                try:
                    _, high = reader.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=kafka.timeout_s
                    )
                except KafkaException:
                    continue
                ends[(topic, partition)] = int(high)
    finally:
        reader.close()
    return ends


#: How far back from a partition's end the newest record is looked for: transaction
#: markers take offsets without being records.
_TAIL = 20


def last_timestamp(kafka: KafkaSettings, topic: str, partition: int) -> int | None:
    """The newest timestamp among the last records of a partition (None if it has none)."""
    reader = consumer(kafka)
    try:
        low, high = reader.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=kafka.timeout_s
        )
        if high <= low:
            return None
        reader.assign([TopicPartition(topic, partition, max(low, high - _TAIL))])
        newest: int | None = None
        while True:
            message = reader.poll(kafka.timeout_s)
            if message is None:
                break
            if message.error() is not None:
                break  # the end of the partition (or a fetch failure: stop here)
            kind, stamp = message.timestamp()
            if kind != TIMESTAMP_NOT_AVAILABLE:
                newest = stamp if newest is None else max(newest, stamp)
            if (message.offset() or 0) + 1 >= high:
                break
        return newest
    except KafkaException:
        return None
    finally:
        reader.close()


def checkpoints(backup: KafkaSettings) -> list[GroupCheckpoint]:
    """The newest checkpoint of every (group, topic, partition), from the backup's
    ``primary.checkpoints.internal`` (empty if it has none yet or does not answer)."""
    newest: dict[tuple[str, str, int], GroupCheckpoint] = {}
    try:
        for message in read_records(backup, CHECKPOINTS_TOPIC, start=StartAt(beginning=True)):
            found = decode_checkpoint(message.key() or b"", message.value() or b"")
            if found is None:
                continue
            group, topic, partition, upstream, downstream = found
            newest[(group, topic, partition)] = GroupCheckpoint(
                group, topic, partition, upstream, downstream, message.timestamp()[1]
            )
    except (KappaflowError, KafkaException):
        return []
    return [newest[k] for k in sorted(newest)]


def decode_checkpoint(key: bytes, value: bytes) -> tuple[str, str, int, int, int] | None:
    """A MirrorMaker checkpoint record (Kafka's protocol types, big-endian): the key is
    group and topic (each an int16 length and UTF-8) and an int32 partition; the value a
    version (int16, 0), the upstream and downstream offsets (int64) and metadata."""
    try:
        group, rest = _string(key)
        topic, rest = _string(rest)
        (partition,) = struct.unpack_from(">i", rest)
        version, upstream, downstream = struct.unpack_from(">hqq", value)
    except (struct.error, UnicodeDecodeError):
        return None
    if version != 0:
        return None
    return group, topic, partition, upstream, downstream


def _string(data: bytes) -> tuple[str, bytes]:
    (length,) = struct.unpack_from(">h", data)
    return data[2 : 2 + length].decode(), data[2 + length :]


def report(mirror: Mirror) -> dict[str, Any]:
    """``kappaflow mirror status``: whether MirrorMaker runs, what it replicates, each
    mirrored partition's lag and last mirrored timestamp, and the groups' checkpoints."""
    proc = mirror.process.status()
    plan = plan_or_settings(mirror)
    found: dict[str, Any] = {
        "state": proc.state.value,
        "pid": proc.pid,
        "started_at": iso(from_epoch_ms(int(proc.started_at * 1000))) if proc.started_at else None,
        **plan,
    }
    if plan["backup"] is None:
        return found
    backup = mirror.backup(plan["backup"])
    primary = mirror.primary
    if proc.started_at is not None:
        found["connectors"] = connector_states(backup, since_ms=int(proc.started_at * 1000))
    partitions, unreachable = mirrored_partitions(primary, backup, plan["topics"])
    found["partitions"] = [p.to_json() for p in partitions]
    reached = [p.mirrored_until_ms for p in partitions if p.mirrored_until_ms is not None]
    # The failover point: every partition holds what the primary had up to this time.
    found["mirrored_until"] = iso(from_epoch_ms(min(reached))) if reached else None
    held = checkpoints(backup) if "backup" not in unreachable else []
    found["checkpoints"] = [c.to_json() for c in held]
    newest = max((c.at_ms for c in held), default=None)
    found["last_checkpoint"] = iso(from_epoch_ms(newest)) if newest is not None else None
    found["unreachable"] = unreachable
    return found

"""The correctness check: every window's count, recomputed from the log, against the engine's.

The expected counts are computed here in plain Python from the events as Kafka holds
them (a consumer reading the topic from its start to the end it has when the check
begins), with the ad-to-campaign table from Redis: parse, keep views, bucket by
``event_time`` into 10-second windows. Nothing of the engine's code or output is used.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from kappaflow.errors import KafkaClusterError
from kappaflow.kafka.clients import consumer
from kappaflow.kafka.topics import topic_partitions
from kappaflow.settings import KafkaSettings
from kappaflow_bench.ysb.workload import window_start

Window = tuple[str, int]  # (campaign id, window start ms)


@dataclass
class Expected:
    counts: Counter[Window] = field(default_factory=Counter)
    events: int = 0
    views: int = 0
    #: Events whose ad is not in the table, or that are not valid YSB events.
    unknown: int = 0
    first_event_ms: int | None = None
    last_event_ms: int | None = None


def read_all(kafka: KafkaSettings, topic: str, *, timeout_s: float = 300) -> Iterator[Message]:
    """Every record of ``topic`` from its start to the end it has now, in partition order."""
    reader = consumer(kafka, **{"fetch.max.bytes": 52_428_800, "enable.partition.eof": False})
    try:
        ends: dict[int, int] = {}
        for part in topic_partitions(kafka, topic):
            low, high = reader.get_watermark_offsets(
                TopicPartition(topic, part), timeout=kafka.timeout_s
            )
            if high > low:
                ends[part] = high
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        deadline = time.monotonic() + timeout_s
        while ends:
            if time.monotonic() > deadline:
                raise KafkaClusterError(f"reading {topic!r} took more than {timeout_s:.0f}s")
            for message in reader.consume(10_000, timeout=1.0):
                got, offset = message.partition(), message.offset()
                if message.error() is not None or got is None or offset is None:
                    continue
                end = ends.get(got)
                if end is None or offset >= end:
                    continue
                if offset == end - 1:
                    del ends[got]
                yield message
    finally:
        reader.close()


def expected_counts(kafka: KafkaSettings, topic: str, table: dict[str, str]) -> Expected:
    """Count the views of every (campaign, window) in ``topic`` as it is now."""
    result = Expected()
    for message in read_all(kafka, topic):
        result.events += 1
        _tally(result, message.value() or b"", table)
    return result


def _tally(result: Expected, raw: bytes, table: dict[str, str]) -> None:
    try:
        event = json.loads(raw)
        event_time = int(event["event_time"])
        kind, ad = event["event_type"], event["ad_id"]
    except (ValueError, KeyError, TypeError):
        result.unknown += 1
        return
    if result.first_event_ms is None or event_time < result.first_event_ms:
        result.first_event_ms = event_time
    if result.last_event_ms is None or event_time > result.last_event_ms:
        result.last_event_ms = event_time
    if kind != "view":
        return
    campaign = table.get(ad)
    if campaign is None:
        result.unknown += 1
        return
    result.views += 1
    result.counts[(campaign, window_start(event_time))] += 1


@dataclass(frozen=True)
class Mismatch:
    campaign: str
    window_start: int
    expected: int
    actual: int | None

    def as_json(self) -> dict[str, object]:
        return {
            "campaign": self.campaign,
            "window_start": self.window_start,
            "expected": self.expected,
            "actual": self.actual,
        }


def compare(expected: Counter[Window], actual: dict[Window, int]) -> list[Mismatch]:
    """Every window whose count differs, is missing, or should not exist."""
    out = [
        Mismatch(campaign, start, count, actual.get((campaign, start)))
        for (campaign, start), count in expected.items()
        if actual.get((campaign, start)) != count
    ]
    out += [
        Mismatch(campaign, start, 0, count)
        for (campaign, start), count in actual.items()
        if (campaign, start) not in expected
    ]
    return sorted(out, key=lambda m: (m.window_start, m.campaign))

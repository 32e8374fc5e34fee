"""Reading and writing records of a topic: JSON lines in, JSON lines out, time ranges.

The tools read explicit offsets with a consumer that never commits, so inspecting or
replaying a topic never disturbs a consumer group.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from kappaflow.errors import (
    ConsumeError,
    OutOfRangeError,
    PartitionNotFoundError,
    ProduceError,
    SameTopicError,
)
from kappaflow.kafka.clients import at_end, consumer, describe, producer
from kappaflow.kafka.topics import create_topic, topic_partitions
from kappaflow.settings import KafkaSettings
from kappaflow.timeutil import from_epoch_ms, iso, to_epoch_ms

Progress = Callable[[int], None]


@dataclass
class ProduceReport:
    sent: int = 0
    invalid: list[tuple[int, str]] = field(default_factory=list)


def produce_lines(
    kafka: KafkaSettings,
    topic: str,
    lines: Iterable[str],
    *,
    key_field: str | None = None,
    progress: Progress | None = None,
) -> ProduceReport:
    """Send each valid JSON line as one record; collect invalid lines with their numbers.

    Blank lines are skipped. With ``key_field`` every line must be an object holding that
    field, whose value becomes the record key (strings as they are, others as JSON).
    """
    topic_partitions(kafka, topic)
    report = ProduceReport()
    failures: list[str] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err.str())

    client = producer(kafka)
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            report.invalid.append((number, f"not JSON: {exc.msg} at column {exc.colno}"))
            continue
        key: str | None = None
        if key_field is not None:
            if not isinstance(value, dict):
                report.invalid.append((number, f"not a JSON object, so no field {key_field!r}"))
                continue
            if key_field not in value or value[key_field] is None:
                report.invalid.append((number, f"missing key field {key_field!r}"))
                continue
            field_value = value[key_field]
            key = field_value if isinstance(field_value, str) else json.dumps(field_value)
        produce_with_retry(
            client,
            topic,
            line.encode(),
            key.encode() if key is not None else None,
            on_delivery=delivered,
        )
        report.sent += 1
        if progress is not None:
            progress(report.sent)
    remaining = client.flush(kafka.timeout_s * 3)
    if remaining or failures:
        reason = failures[0] if failures else f"{remaining} records still queued"
        raise ProduceError(f"sending to {topic!r} failed: {reason}")
    return report


def _raw(data: bytes | str | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def produce_with_retry(
    client: Any,
    topic: str,
    value: bytes | None,
    key: bytes | None = None,
    *,
    poll_s: float = 0.5,
    **kwargs: Any,
) -> None:
    """``client.produce``, waiting while the producer's local queue is full.

    A full queue (``BufferError``) is back-pressure, not a failure: poll up to ``poll_s``
    to serve deliveries and free room, then try again. A producer that asks for delivery
    reports of errors only gets few callbacks, so each poll waits its whole ``poll_s``:
    a fast sender gives a short one.
    """
    while True:
        try:
            # Positional: in a loop over many records, keywords make each call a quarter slower.
            client.produce(topic, value, key, **kwargs)
            return
        except BufferError:
            client.poll(poll_s)


@dataclass(frozen=True)
class StartAt:
    """Where a read starts: the beginning, an offset, a time, or the end (default)."""

    beginning: bool = False
    offset: int | None = None
    since: datetime | None = None


def read_records(
    kafka: KafkaSettings,
    topic: str,
    *,
    start: StartAt,
    until: datetime | None = None,
    max_records: int | None = None,
    partition: int | None = None,
    follow: bool | None = None,
) -> Iterator[Message]:
    """Records of ``topic`` from ``start``, in per-partition order.

    Without ``follow`` the read ends at the end of the log as it was when the read began
    (``follow`` defaults to True only when starting at the end). ``until`` ends each
    partition at its first record stamped later than that time.
    """
    if max_records is not None and max_records < 0:
        raise OutOfRangeError("--max must not be negative")
    partitions = topic_partitions(kafka, topic)
    if partition is not None:
        if partition not in partitions:
            raise PartitionNotFoundError(
                f"topic {topic!r} has no partition {partition} (has {len(partitions)})"
            )
        partitions = [partition]
    if follow is None:
        follow = not (start.beginning or start.offset is not None or start.since is not None)
    reader = consumer(kafka)
    try:
        assignment = _start_offsets(reader, kafka, topic, partitions, start)
        ends: dict[int, int] = {}
        active = {tp.partition for tp in assignment}
        if not follow:
            for tp in assignment:
                try:
                    low, high = reader.get_watermark_offsets(tp, timeout=kafka.timeout_s)
                except KafkaException as exc:  # e.g. a partition without a leader
                    raise ConsumeError(
                        f"cannot read the ends of {topic!r} partition {tp.partition}: "
                        f"{describe(exc)}"
                    ) from None
                ends[tp.partition] = high
                first = low if tp.offset == OFFSET_BEGINNING else tp.offset
                if tp.offset == OFFSET_END or first >= high:
                    active.discard(tp.partition)
        if not active and not follow:
            return
        reader.assign([tp for tp in assignment if tp.partition in active])
        until_ms = to_epoch_ms(until) if until is not None else None
        emitted = 0
        while active and (max_records is None or emitted < max_records):
            message = reader.poll(0.5)
            if message is None:
                continue
            part = message.partition()
            if at_end(message, topic):
                if not follow and part is not None:
                    active.discard(part)
                continue
            if part is None or part not in active:
                continue
            offset = message.offset() or 0
            stamp_type, stamp = message.timestamp()
            if until_ms is not None and stamp_type != TIMESTAMP_NOT_AVAILABLE and stamp > until_ms:
                active.discard(part)
                reader.incremental_unassign([TopicPartition(topic, part)])
                continue
            if not follow and offset >= ends[part]:
                active.discard(part)
                continue
            emitted += 1
            yield message
            if not follow and offset + 1 >= ends[part]:
                active.discard(part)
    finally:
        reader.close()


def _start_offsets(
    reader: Any, kafka: KafkaSettings, topic: str, partitions: list[int], start: StartAt
) -> list[TopicPartition]:
    if start.since is not None:
        wanted = [TopicPartition(topic, p, to_epoch_ms(start.since)) for p in partitions]
        try:
            found: list[TopicPartition] = reader.offsets_for_times(wanted, timeout=kafka.timeout_s)
        except Exception as exc:
            raise ConsumeError(
                f"cannot look up offsets by time in {topic!r}: {describe(exc)}"
            ) from None
        # A partition without a leader answers with an error of its own, not an exception.
        for tp in found:
            if tp.error is not None:
                raise ConsumeError(
                    f"cannot look up offsets by time in {topic!r} partition {tp.partition}: "
                    f"{tp.error.str()}"
                )
        # -1 means no record at or after that time: such a partition starts at its end.
        return [
            TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
            for tp in found
        ]
    if start.offset is not None:
        if start.offset < 0:
            raise OutOfRangeError("--offset must not be negative")
        return [TopicPartition(topic, p, start.offset) for p in partitions]
    position = OFFSET_BEGINNING if start.beginning else OFFSET_END
    return [TopicPartition(topic, p, position) for p in partitions]


def to_json_record(message: Message) -> dict[str, Any]:
    """A record as the CLI prints it: metadata plus the value (parsed if it is JSON)."""
    stamp_type, stamp = message.timestamp()
    value, encoding = _decode(message.value())
    key, _ = _decode(message.key(), parse_json=False)
    record: dict[str, Any] = {
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        "timestamp": iso(from_epoch_ms(stamp)) if stamp_type != TIMESTAMP_NOT_AVAILABLE else None,
        "key": key,
        "value": value,
    }
    if encoding != "json":
        record["value_encoding"] = encoding
    headers = message.headers()
    if headers:
        pairs = headers.items() if isinstance(headers, dict) else headers
        record["headers"] = {k: _decode(v, parse_json=False)[0] for k, v in pairs}
    return record


def _decode(data: bytes | str | None, *, parse_json: bool = True) -> tuple[Any, str]:
    if data is None:
        return None, "json"
    if isinstance(data, str):
        data = data.encode()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"
    if not parse_json:
        return text, "json"
    try:
        return json.loads(text), "json"
    except json.JSONDecodeError:
        return text, "text"


def replay(
    kafka: KafkaSettings,
    source: str,
    dest: str,
    *,
    since: datetime,
    until: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Copy the records of ``source`` stamped in [since, until] into ``dest``.

    Keys, values, headers and timestamps are kept; a record stays in its partition number
    when ``dest`` has as many partitions, else it is placed by key. ``dest`` is created
    like ``source`` when missing. Returns how many records were copied.
    """
    if source == dest:
        raise SameTopicError("replay needs a destination other than the source")
    source_partitions = topic_partitions(kafka, source)
    create_topic(kafka, dest, partitions=len(source_partitions), exist_ok=True)
    keep_partition = len(topic_partitions(kafka, dest)) >= len(source_partitions)
    total = _count_from(kafka, source, since)
    failures: list[str] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err.str())

    client = producer(kafka)
    copied = 0
    for message in read_records(
        kafka, source, start=StartAt(since=since), until=until, follow=False
    ):
        _, stamp = message.timestamp()
        extra: dict[str, Any] = {"timestamp": stamp, "on_delivery": delivered}
        if keep_partition:
            extra["partition"] = message.partition()
        if message.headers():
            extra["headers"] = message.headers()
        produce_with_retry(client, dest, _raw(message.value()), _raw(message.key()), **extra)
        copied += 1
        if progress is not None:
            progress(copied, total)
    remaining = client.flush(kafka.timeout_s * 3)
    if remaining or failures:
        reason = failures[0] if failures else f"{remaining} records still queued"
        raise ProduceError(f"replaying into {dest!r} failed: {reason}")
    return copied


def _count_from(kafka: KafkaSettings, topic: str, since: datetime) -> int:
    """How many records lie between ``since`` and the end of the log (an upper bound)."""
    reader = consumer(kafka)
    try:
        starts = _start_offsets(
            reader, kafka, topic, topic_partitions(kafka, topic), StartAt(since=since)
        )
        total = 0
        for tp in starts:
            _, high = reader.get_watermark_offsets(tp, timeout=kafka.timeout_s)
            if tp.offset >= 0:
                total += max(0, high - tp.offset)
        return total
    finally:
        reader.close()

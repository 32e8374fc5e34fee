"""A job's dead letters: listed with their reasons, and replayed through the job, exactly once.

A job's records that do not fit its schema (or that ``Stream.reject`` refused) are in
``JOB.dlq``, each with the reason, where it came from and its original bytes
(streams/output/task_records.py). A replay sends them back into the topic each came from,
to the partition it came from, so the job's own path processes them again: parsing, event
time from the event, windows, sinks. A *fix* (a function of the original bytes and the
reason) may mend them first. Each replayed record carries two headers: the job's name
(``kf-replay-job``) and the dead letter's ``PARTITION:OFFSET`` in ``JOB.dlq``
(``kf-replay-of``). The job counts what it reads back (``dead_letters_replayed``, and
``replays_dead_again`` of those that failed again and went back to ``JOB.dlq``); other jobs
reading the same topic leave them out.

Exactly once: the replay is a Kafka transaction per chunk of dead letters (transactional id
``kappaflow.dlq-replay.JOB``) holding the replayed records and the replay's progress, the
consumer group ``kappaflow.dlq-replay.JOB``'s offset in ``JOB.dlq``
(``send_offsets_to_transaction``). A replay killed at any moment leaves its open
transaction to be aborted (by the next replay's producer, which fences it, or by the
transaction timeout); the jobs read their sources ``read_committed``, so an aborted
chunk is never seen and the next replay starts after the last committed one.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import importlib
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)

from kappaflow.errors import (
    ConsumeError,
    FixFailedError,
    FixFunctionError,
    NoDeadLettersError,
    TopicNotFoundError,
)
from kappaflow.kafka.clients import at_end, consumer, describe, transactional_producer
from kappaflow.kafka.topics import topic_partitions
from kappaflow.settings import Settings
from kappaflow.streams.ops.parsing import REPLAY_JOB_HEADER, REPLAY_OF_HEADER
from kappaflow.timeutil import from_epoch_ms, iso

#: A fix: the dead letter's original bytes (None: it had none) and its reason → the
#: bytes to replay, or None to pass it over (it stays in ``JOB.dlq``, not replayed).
Fix = Callable[[bytes | None, str], bytes | None]

#: How many dead letters one transaction of a replay holds, by default.
CHUNK = 100


def dlq_topic(job: str) -> str:
    return f"{job}.dlq"


def replay_id(job: str) -> str:
    """The replay's transactional id and consumer group: one replay of a job at a time."""
    return f"kappaflow.dlq-replay.{job}"


@dataclass(frozen=True)
class DeadLetter:
    """One record of ``JOB.dlq``."""

    #: Where it is in ``JOB.dlq``.
    partition: int
    offset: int
    #: When it was dead-lettered (the record's Kafka timestamp).
    at: datetime | None
    reason: str
    source_topic: str | None
    source_partition: int | None
    source_offset: int | None
    #: The original bytes (None: the record had none, or the dead letter is not readable).
    value: bytes | None
    #: Which dead letter this one replayed, if it is a replay that failed again.
    replay_of: str | None
    #: Whether a replay has passed it (replayed, or passed over by a fix).
    replayed: bool

    def as_json(self) -> dict[str, Any]:
        found = asdict(self)
        found["at"] = iso(self.at) if self.at is not None else None
        value = self.value
        found["value"] = _text(value)
        found["value_base64"] = base64.b64encode(value).decode() if value else None
        return found


@dataclass
class ReplayReport:
    """What one replay did."""

    job: str
    #: Dead letters read, of them replayed, passed over by the fix, or not replayable
    #: (not a dead letter kappaflow wrote, or without the topic it came from).
    read: int = 0
    replayed: int = 0
    skipped: int = 0
    unroutable: int = 0
    #: Transactions committed.
    transactions: int = 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def dead_letters(settings: Settings, job: str, *, limit: int | None = None) -> list[DeadLetter]:
    """The dead letters of ``job`` (committed ones, oldest first per partition), each
    with whether a replay has passed it; NoDeadLettersError if the job has no
    dead-letter topic."""
    topic = dlq_topic(job)
    partitions = _partitions(settings, job)
    reader = consumer(settings.kafka, **{"group.id": replay_id(job)})
    try:
        done = _committed(reader, topic, partitions, settings.kafka.timeout_s)
        found: list[DeadLetter] = []
        for message in _read(reader, topic, partitions, None, settings.kafka.timeout_s):
            letter = _letter(message, done)
            found.append(letter)
            if limit is not None and len(found) >= limit:
                break
        return found
    finally:
        reader.close()


def replay(
    settings: Settings,
    job: str,
    *,
    fix: Fix | None = None,
    chunk: int = CHUNK,
    on_chunk: Callable[[ReplayReport], None] | None = None,
) -> ReplayReport:
    """Send ``job``'s dead letters not replayed yet (those in ``JOB.dlq`` when it starts)
    back into the topics they came from, mended by ``fix`` if given, exactly once; see the
    module docstring. ``on_chunk`` is told after each committed transaction."""
    topic = dlq_topic(job)
    partitions = _partitions(settings, job)
    report = ReplayReport(job)
    # Fences a replay of the same job that still runs or was killed, and aborts what it
    # left open, before this one reads where the committed replays got to.
    producer = transactional_producer(settings.kafka, replay_id(job))
    reader = consumer(settings.kafka, **{"group.id": replay_id(job)})
    targets: dict[str, int] = {}
    try:
        done = _committed(reader, topic, partitions, settings.kafka.timeout_s)
        pending: list[Message] = []
        for message in _read(reader, topic, partitions, done, settings.kafka.timeout_s):
            pending.append(message)
            if len(pending) >= chunk:
                _transaction(producer, reader, job, pending, fix, targets, report, settings)
                pending = []
                if on_chunk is not None:
                    on_chunk(report)
        if pending:
            _transaction(producer, reader, job, pending, fix, targets, report, settings)
            if on_chunk is not None:
                on_chunk(report)
        return report
    finally:
        reader.close()
        producer.flush(settings.kafka.timeout_s)


def load_fix(reference: str) -> Fix:
    """The function ``module:function`` names (FixFunctionError if it names none)."""
    module_name, sep, name = reference.partition(":")
    if not sep or not module_name or not name:
        raise FixFunctionError(f"--fix {reference!r}: give MODULE:FUNCTION, e.g. fixes:orders")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        first = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise FixFunctionError(
            f"--fix {reference!r}: cannot import {module_name!r} ({first})"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise FixFunctionError(f"--fix {reference!r}: {module_name} has no function {name!r}")
    return function  # type: ignore[no-any-return]


# -- inside ------------------------------------------------------------------------------


def _partitions(settings: Settings, job: str) -> list[int]:
    try:
        return topic_partitions(settings.kafka, dlq_topic(job))
    except TopicNotFoundError:
        raise NoDeadLettersError(
            f"job {job!r} has no dead-letter topic {dlq_topic(job)!r}: no job of that name "
            "has run on this cluster"
        ) from None


def _committed(
    reader: Consumer, topic: str, partitions: list[int], timeout: float
) -> dict[int, int]:
    """Where the committed replays got to, per partition of ``JOB.dlq`` (0: nowhere)."""
    asked = [TopicPartition(topic, p) for p in partitions]
    try:
        found = reader.committed(asked, timeout=timeout)
    except KafkaException as exc:
        raise ConsumeError(
            f"cannot read the replay's progress in {topic!r}: {describe(exc)}"
        ) from None
    return {tp.partition: max(tp.offset, 0) if tp.offset != OFFSET_INVALID else 0 for tp in found}


def _read(
    reader: Consumer,
    topic: str,
    partitions: list[int],
    start: dict[int, int] | None,
    timeout: float,
) -> Iterator[Message]:
    """The committed records of ``topic`` from ``start`` (None: the beginning) to its end
    as it is when the read begins, partition after partition's turn as they come."""
    ends: dict[int, int] = {}
    active: set[int] = set()
    assignment = []
    for p in partitions:
        tp = TopicPartition(topic, p)
        try:
            low, high = reader.get_watermark_offsets(tp, timeout=timeout)
        except KafkaException as exc:
            raise ConsumeError(f"cannot read the ends of {topic!r}: {describe(exc)}") from None
        first = max(low, start.get(p, 0)) if start is not None else low
        ends[p] = high
        if first < high:
            active.add(p)
            assignment.append(TopicPartition(topic, p, first if first > 0 else OFFSET_BEGINNING))
    if not active:
        return
    reader.assign(assignment)
    while active:
        message = reader.poll(0.5)
        if message is None:
            continue
        part = message.partition()
        if at_end(message, topic):
            active.discard(part if part is not None else -1)
            continue
        if part is None or part not in active:
            continue
        offset = message.offset() or 0
        if offset >= ends[part]:
            active.discard(part)
            continue
        yield message
        if offset + 1 >= ends[part]:
            active.discard(part)


def _letter(message: Message, done: dict[int, int]) -> DeadLetter:
    body = _body(message)
    stamp_type, stamp = message.timestamp()
    partition, offset = message.partition() or 0, message.offset() or 0
    encoded = body.get("value_base64")
    try:
        value = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else None
    except (binascii.Error, ValueError):
        value = None
    return DeadLetter(
        partition=partition,
        offset=offset,
        at=from_epoch_ms(stamp) if stamp_type != TIMESTAMP_NOT_AVAILABLE else None,
        reason=str(body.get("error") or body.get("reason") or "not a dead letter kappaflow wrote"),
        source_topic=_str(body.get("source_topic")),
        source_partition=_int(body.get("source_partition")),
        source_offset=_int(body.get("source_offset")),
        value=value,
        replay_of=_str(body.get("replay_of")),
        replayed=offset < done.get(partition, 0),
    )


def _transaction(
    producer: Any,
    reader: Consumer,
    job: str,
    messages: list[Message],
    fix: Fix | None,
    targets: dict[str, int],
    report: ReplayReport,
    settings: Settings,
) -> None:
    """One transaction: ``messages``' dead letters replayed, and the replay's progress
    past them."""
    timeout = settings.kafka.timeout_s
    producer.begin_transaction()
    try:
        counts = {"replayed": 0, "skipped": 0, "unroutable": 0}
        for message in messages:
            letter = _letter(message, {})
            where = f"{letter.partition}:{letter.offset}"
            topic = letter.source_topic
            if topic is None or "value_base64" not in _body(message):
                counts["unroutable"] += 1
                continue
            fixed = _fixed(fix, letter, where) if fix is not None else letter.value
            if fixed is None:
                counts["skipped"] += 1
                continue
            partitions = targets.get(topic)
            if partitions is None:
                try:
                    partitions = targets[topic] = len(topic_partitions(settings.kafka, topic))
                except TopicNotFoundError:
                    partitions = targets[topic] = 0
            if partitions == 0:
                counts["unroutable"] += 1
                continue
            headers = [(REPLAY_JOB_HEADER, job.encode()), (REPLAY_OF_HEADER, where.encode())]
            extra: dict[str, Any] = {}
            source = letter.source_partition
            if source is not None and 0 <= source < partitions:
                # Back to the partition it came from: in the order of its neighbours.
                extra["partition"] = source
            producer.produce(topic, value=fixed, headers=headers, **extra)
            counts["replayed"] += 1
        last: dict[int, int] = {}
        for message in messages:
            part = message.partition() or 0
            last[part] = max(last.get(part, -1), message.offset() or 0)
        progress = [TopicPartition(dlq_topic(job), p, o + 1) for p, o in sorted(last.items())]
        producer.send_offsets_to_transaction(progress, reader.consumer_group_metadata(), timeout)
        producer.commit_transaction(timeout)
    except BaseException:
        # What this transaction sent is never seen by read_committed readers.
        with contextlib.suppress(KafkaException):
            producer.abort_transaction(timeout)
        raise
    report.read += len(messages)
    report.replayed += counts["replayed"]
    report.skipped += counts["skipped"]
    report.unroutable += counts["unroutable"]
    report.transactions += 1


def _fixed(fix: Fix, letter: DeadLetter, where: str) -> bytes | None:
    try:
        fixed = fix(letter.value, letter.reason)
    except Exception as exc:
        first = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise FixFailedError(f"the fix failed on dead letter {where}: {first}") from None
    if fixed is not None and not isinstance(fixed, bytes | bytearray):
        raise FixFailedError(
            f"the fix returned {type(fixed).__name__} for dead letter {where}: "
            "return bytes, or None to pass the dead letter over"
        )
    return bytes(fixed) if fixed is not None else None


def _body(message: Message) -> dict[str, Any]:
    try:
        found = json.loads(message.value() or b"")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

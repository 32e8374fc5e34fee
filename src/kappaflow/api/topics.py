"""The service's topic browser: the topics, a page of a topic's records, and its new
records as they arrive.

- ``GET /v1/topics``: each topic with its partitions, records (end minus start offsets,
  summed over partitions) and the rate of records stamped in the last minute. Internal
  topics (``__consumer_offsets`` …) only with ``?internal=true``.
- ``GET /v1/topics/{topic}/records``: a page of records from the start, an offset
  (``offset``), a time (``from``) or the ``next`` cursor of the page before.
- ``GET /v1/topics/{topic}/follow``: Server-Sent Events, one ``record`` event per new
  record, from the end (or ``from``) until the client leaves.

Reads are ``read_committed`` and never commit: browsing a topic moves no consumer group.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from confluent_kafka import (
    OFFSET_END,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec
from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from kappaflow.api.sse import ERROR, Event, event_stream
from kappaflow.errors import (
    ApiBadRequestError,
    ConsumeError,
    KafkaRequestError,
    KafkaUnreachableError,
    KappaflowError,
    PartitionNotFoundError,
    TopicFollowerTooSlowError,
)
from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.kafka.clients import admin, at_end, cluster_metadata, consumer, describe
from kappaflow.kafka.records import StartAt, _start_offsets
from kappaflow.kafka.topics import INTERNAL_PREFIX, topic_partitions
from kappaflow.settings import KafkaSettings, Settings
from kappaflow.timeutil import from_epoch_ms, iso, parse_time

MAX_LIMIT = 1000
EARLIEST: OffsetSpec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
LATEST: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
#: The rate of ``GET /v1/topics`` counts the records stamped in this last stretch of time.
RATE_WINDOW_S = 60
#: Records a follower's stream may hold back while its client reads: past that, the
#: client is too slow for the topic and is dropped instead of buffering without bound.
FOLLOW_QUEUE = 1000
#: A comment line this often keeps an idle stream open through proxies, and lets the
#: server notice a client that left while no record came.
KEEPALIVE_S = 10.0
#: A follower's consumer prefetches at most this much per partition (librdkafka's default,
#: 64 MiB, is far more than a browser reads).
FOLLOW_PREFETCH_KB = 1024


_TEXT_OR_BASE64 = "UTF-8 text, or base64 when the bytes are not UTF-8 (then `{0}_base64` is true)"
#: A record as the topic browser answers it (``record_json``).
_RECORD: dict[str, Any] = {
    "type": "object",
    "properties": {
        "partition": {"type": "integer"},
        "offset": {"type": "integer"},
        "timestamp": {"type": ["string", "null"], "format": "date-time"},
        "key": {"type": ["string", "null"], "description": _TEXT_OR_BASE64.format("key")},
        "key_base64": {"type": "boolean"},
        "value": {"type": ["string", "null"], "description": _TEXT_OR_BASE64.format("value")},
        "value_base64": {"type": "boolean"},
        "headers": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "key": {"type": "string"},
                    "value": {"type": ["string", "null"]},
                    "base64": {"type": "boolean"},
                },
            },
        },
    },
    "required": ["partition", "offset", "timestamp", "key", "value", "headers"],
}
#: The follow route's answer in the OpenAPI description.
FOLLOW_STREAM = event_stream(
    "Server-Sent Events: `start`, then a `record` per new record, until the client "
    "leaves or an `error` ends the stream.",
    [
        Event(
            "start",
            "the offsets the stream starts at: a record written after them is in the stream",
            {
                "type": "object",
                "properties": {
                    "topic": {"type": "string"},
                    "offsets": {
                        "type": "object",
                        "description": "partition → offset",
                        "additionalProperties": {"type": "integer"},
                    },
                },
                "required": ["topic", "offsets"],
            },
        ),
        Event("record", "a new record of the topic", _RECORD, id="the record's `partition:offset`"),
        ERROR,
    ],
    'event: start\ndata: {"topic": "views", "offsets": {"0": 41, "1": 37}}\n\n'
    'event: record\nid: 0:41\ndata: {"partition": 0, "offset": 41, '
    '"timestamp": "2026-11-27T10:05:00.000Z", "key": "u2", "key_base64": false, '
    '"value": "{\\"page\\": \\"/\\"}", "value_base64": false, "headers": []}\n\n',
)


def add_topic_routes(app: FastAPI, settings: Settings) -> None:
    """Add the topic browser's endpoints to ``app``."""
    kafka = settings.kafka

    @app.exception_handler(KafkaUnreachableError)
    async def kafka_down(_request: Request, exc: KafkaUnreachableError) -> JSONResponse:
        return JSONResponse({"code": exc.code, "error": str(exc)}, status_code=503)

    # The embedded broker's log directory: each partition's size on disk, read there.
    log_dir = EmbeddedBroker(settings).data_dir if settings.kafka.embedded else None

    @app.get("/v1/topics", summary="The topics: partitions, records and recent rate.")
    def list_topics(
        internal: Annotated[bool, Query(description="include internal topics")] = False,
    ) -> dict[str, Any]:
        return {"items": topic_summaries(kafka, include_internal=internal, log_dir=log_dir)}

    @app.get(
        "/v1/topics/{topic}/records",
        summary="A page of a topic's records from the start, an offset, a time or a cursor.",
    )
    def records(
        topic: str,
        partition: Annotated[int | None, Query(ge=0, description="this partition only")] = None,
        offset: Annotated[
            int | None, Query(ge=0, description="from this offset of each partition")
        ] = None,
        start_from: Annotated[
            str | None, Query(alias="from", description="from the first record stamped at or after")
        ] = None,
        cursor: Annotated[str | None, Query(description="the next of the page before")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="at most this many")] = 100,
    ) -> dict[str, Any]:
        starts = {"offset": offset, "from": start_from, "cursor": cursor}
        given = [name for name, value in starts.items() if value is not None]
        if len(given) > 1:
            raise ApiBadRequestError(f"give one of offset, from and cursor, not {given}")
        partitions = _partitions(kafka, topic, partition)
        reader = consumer(kafka)
        try:
            if cursor is not None:
                positions = _parse_cursor(cursor, topic, kafka, partition)
            else:
                start = StartAt(
                    beginning=offset is None and start_from is None,
                    offset=offset,
                    since=_time(start_from, "from") if start_from is not None else None,
                )
                positions = _positions(reader, kafka, topic, partitions, start)
            return read_page(reader, kafka, topic, positions, limit)
        finally:
            reader.close()

    @app.get(
        "/v1/topics/{topic}/follow",
        summary="Server-Sent Events of the topic's new records, from the end or a time.",
        response_class=StreamingResponse,
        responses=FOLLOW_STREAM,
    )
    async def follow(
        request: Request,
        topic: str,
        partition: Annotated[int | None, Query(ge=0, description="this partition only")] = None,
        start_from: Annotated[
            str | None, Query(alias="from", description="from the first record stamped at or after")
        ] = None,
    ) -> StreamingResponse:
        since = _time(start_from, "from") if start_from is not None else None
        # The start offsets are fixed before the answer begins: a record produced once the
        # client has the answer's headers is one it sees.
        positions = await asyncio.to_thread(_follow_start, kafka, topic, partition, since)
        metrics = getattr(request.app.state, "metrics", None)
        follower = _Follower(kafka, topic, positions, asyncio.get_running_loop(), metrics)
        return StreamingResponse(
            _events(follower),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


# The topics.


def topic_summaries(
    kafka: KafkaSettings, *, include_internal: bool, log_dir: Path | None = None
) -> list[dict[str, Any]]:
    """Each topic by name: partitions, records, records per second over the last minute,
    and, given the broker's log directory (the embedded broker's), its bytes on disk.

    The record count is end minus start offset per partition: in a topic written in
    transactions it counts the transactions' commit markers too. The rate counts the
    records whose timestamp falls in the last ``RATE_WINDOW_S`` seconds, as the log
    stamped them (a producer may stamp records with any time: a replay keeps the old
    ones)."""
    metadata = cluster_metadata(kafka)
    names = sorted(
        name
        for name, topic in metadata.topics.items()
        if topic.error is None and (include_internal or not name.startswith(INTERNAL_PREFIX))
    )
    wanted = [TopicPartition(n, p) for n in names for p in sorted(metadata.topics[n].partitions)]
    since_ms = int(time.time() * 1000) - RATE_WINDOW_S * 1000
    starts = list_offsets(kafka, wanted, EARLIEST)
    ends = list_offsets(kafka, wanted, LATEST)
    recent = list_offsets(kafka, wanted, OffsetSpec.for_timestamp(since_ms))
    rows = []
    for name in names:
        parts = sorted(metadata.topics[name].partitions)
        total = sum(ends[(name, p)] - starts[(name, p)] for p in parts)
        # -1: no record stamped at or after the time, so none in the window.
        stamped = sum(ends[(name, p)] - recent[(name, p)] for p in parts if recent[(name, p)] >= 0)
        rows.append(
            {
                "name": name,
                "partitions": len(parts),
                "records": total,
                "records_last_minute": stamped,
                "rate_per_s": round(stamped / RATE_WINDOW_S, 3),
                "bytes_on_disk": _disk_bytes(log_dir, name, parts),
            }
        )
    return rows


def _disk_bytes(log_dir: Path | None, name: str, partitions: list[int]) -> int | None:
    """The size of the topic's partition directories (segments and indexes), or None
    without a log directory to read (a broker elsewhere)."""
    if log_dir is None:
        return None
    total = 0
    for partition in partitions:
        with contextlib.suppress(OSError):  # a segment deleted while listed
            for entry in os.scandir(log_dir / f"{name}-{partition}"):
                if entry.is_file():
                    total += entry.stat().st_size
    return total


def list_offsets(
    kafka: KafkaSettings, partitions: list[TopicPartition], spec: OffsetSpec
) -> dict[tuple[str, int], int]:
    """The offset ``spec`` names in each partition, by (topic, partition), in one request."""
    if not partitions:
        return {}
    client = admin(kafka)
    futures = client.list_offsets(dict.fromkeys(partitions, spec), request_timeout=kafka.timeout_s)
    found: dict[tuple[str, int], int] = {}
    try:
        for tp, future in futures.items():
            found[(tp.topic, tp.partition)] = int(future.result(timeout=kafka.timeout_s).offset)
    except KafkaException as exc:
        raise KafkaRequestError(f"cannot list the topics' offsets: {describe(exc)}") from None
    return found


# A page of records.


def read_page(
    reader: Any, kafka: KafkaSettings, topic: str, positions: dict[int, int], limit: int
) -> dict[str, Any]:
    """Up to ``limit`` records from ``positions`` (offset by partition), each partition up
    to its end as the read began; ``next``, the positions after them, or None when every
    partition was read to its end."""
    ends: dict[int, int] = {}
    active: set[int] = set()
    for part, start in positions.items():
        low, high = reader.get_watermark_offsets(
            TopicPartition(topic, part), timeout=kafka.timeout_s
        )
        ends[part] = high
        # An offset below the log's start (deleted by retention) reads from the start.
        positions[part] = max(start, low)
        if positions[part] < high:
            active.add(part)
    found: list[Message] = []
    if active:
        reader.assign([TopicPartition(topic, p, positions[p]) for p in sorted(active)])
    # A partition whose end is an open transaction's never reaches it in read_committed:
    # the page ends after this long with what it has.
    deadline = time.monotonic() + kafka.timeout_s
    while active and len(found) < limit and time.monotonic() < deadline:
        message = reader.poll(0.2)
        if message is None:
            continue
        part = message.partition()
        if at_end(message, topic):
            if part is not None:
                # Past aborted records and transaction markers, up to the end.
                positions[part] = max(positions[part], message.offset() or 0)
                active.discard(part)
            continue
        if part is None or part not in active:
            continue
        offset = message.offset() or 0
        found.append(message)
        positions[part] = offset + 1
        if positions[part] >= ends[part]:
            active.discard(part)
    done = all(positions[p] >= ends[p] for p in positions)
    return {
        "items": [record_json(m) for m in sorted(found, key=_place)],
        "next": None if done else _cursor(positions),
    }


def _place(message: Message) -> tuple[int, int]:
    return (message.partition() or 0, message.offset() or 0)


def record_json(message: Message) -> dict[str, Any]:
    """A record as the service answers it: place, time, key, value and headers; key,
    values and header values as UTF-8 text, or as base64 when they are not UTF-8."""
    stamp_type, stamp = message.timestamp()
    key, key_base64 = _text(message.key())
    value, value_base64 = _text(message.value())
    headers = []
    given = message.headers() or []
    pairs = given.items() if isinstance(given, dict) else given
    for name, raw in pairs:
        text, is_base64 = _text(raw)
        headers.append({"key": name, "value": text, "base64": is_base64})
    return {
        "partition": message.partition(),
        "offset": message.offset(),
        "timestamp": iso(from_epoch_ms(stamp)) if stamp_type != TIMESTAMP_NOT_AVAILABLE else None,
        "key": key,
        "key_base64": key_base64,
        "value": value,
        "value_base64": value_base64,
        "headers": headers,
    }


def _text(data: bytes | str | None) -> tuple[str | None, bool]:
    if data is None or isinstance(data, str):
        return data, False
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), True


def _cursor(positions: dict[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(positions.items()))


def _parse_cursor(
    cursor: str, topic: str, kafka: KafkaSettings, partition: int | None
) -> dict[int, int]:
    """``0:15,1:22`` as {0: 15, 1: 22}; only ``partition``'s when one is given."""
    positions: dict[int, int] = {}
    try:
        for pair in cursor.split(","):
            part, _, offset = pair.partition(":")
            positions[int(part)] = int(offset)
    except ValueError:
        raise ApiBadRequestError(
            f"cursor {cursor!r} is not PARTITION:OFFSET pairs separated by commas "
            "(give the next of the page before)"
        ) from None
    known = topic_partitions(kafka, topic)
    if any(o < 0 for o in positions.values()) or not set(positions) <= set(known):
        raise ApiBadRequestError(f"cursor {cursor!r} is not a position in {topic!r}")
    return {p: o for p, o in positions.items() if partition is None or p == partition}


def _partitions(kafka: KafkaSettings, topic: str, partition: int | None) -> list[int]:
    partitions = topic_partitions(kafka, topic)  # TopicNotFoundError (KF404, 404)
    if partition is None:
        return partitions
    if partition not in partitions:
        raise PartitionNotFoundError(
            f"topic {topic!r} has no partition {partition} (its partitions: 0 to "
            f"{len(partitions) - 1})"
        )
    return [partition]


def _positions(
    reader: Any, kafka: KafkaSettings, topic: str, partitions: list[int], start: StartAt
) -> dict[int, int]:
    """The offset in each partition where a read from ``start`` begins: at the end for a
    partition without a record at or after a time."""
    assignment = _start_offsets(reader, kafka, topic, partitions, start)
    positions: dict[int, int] = {}
    for tp in assignment:
        if tp.offset >= 0:
            positions[tp.partition] = tp.offset
            continue
        low, high = reader.get_watermark_offsets(tp, timeout=kafka.timeout_s)
        positions[tp.partition] = high if tp.offset == OFFSET_END else low
    return positions


def _time(given: str, name: str) -> datetime:
    try:
        return parse_time(given)
    except KappaflowError as exc:
        raise ApiBadRequestError(f"{name}: {exc}") from None


# Following a topic.


def _follow_start(
    kafka: KafkaSettings, topic: str, partition: int | None, since: datetime | None
) -> dict[int, int]:
    partitions = _partitions(kafka, topic, partition)
    reader = consumer(kafka)
    try:
        start = StartAt(since=since) if since is not None else StartAt()
        return _positions(reader, kafka, topic, partitions, start)
    finally:
        reader.close()


@dataclass
class _Follower:
    """A consumer in a thread of its own, handing records to the event loop through a
    bounded queue. A full queue means the client reads slower than the topic grows: the
    follower stops and says so."""

    kafka: KafkaSettings
    topic: str
    positions: dict[int, int]
    loop: asyncio.AbstractEventLoop
    #: The service's metrics (``kappaflow.api.metrics.ServiceMetrics``), if it keeps any.
    metrics: Any
    queue: asyncio.Queue[dict[str, Any]] = field(init=False)
    stop: threading.Event = field(default_factory=threading.Event)
    dropped: bool = False
    failure: str | None = None

    def __post_init__(self) -> None:
        self.queue = asyncio.Queue(maxsize=FOLLOW_QUEUE)

    def start(self) -> None:
        threading.Thread(target=self._run, name=f"follow-{self.topic}", daemon=True).start()

    def _run(self) -> None:
        reader = consumer(self.kafka, **{"queued.max.messages.kbytes": FOLLOW_PREFETCH_KB})
        try:
            reader.assign([TopicPartition(self.topic, p, o) for p, o in self.positions.items()])
            while not self.stop.is_set():
                message = reader.poll(0.5)
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    self._hand_over(failure=f"reading {self.topic!r} failed: {error.str()}")
                    return
                self._hand_over(record=record_json(message))
        except Exception as exc:  # the stream ends with the reason, not a silent stop
            self._hand_over(failure=f"reading {self.topic!r} failed: {describe(exc)}")
        finally:
            reader.close()

    def _hand_over(
        self, *, record: dict[str, Any] | None = None, failure: str | None = None
    ) -> None:
        try:
            self.loop.call_soon_threadsafe(self._offer, record, failure)
        except RuntimeError:  # the loop closed: the server is stopping
            self.stop.set()

    def _offer(self, record: dict[str, Any] | None, failure: str | None) -> None:
        """On the loop: queue the record, or end the stream with a failure."""
        if failure is not None:
            self.failure = failure
            self.stop.set()
            if not self.queue.full():
                self.queue.put_nowait({})  # wakes the stream up to end it
            return
        if record is None or self.stop.is_set():
            return
        if self.queue.full():
            self.dropped = True
            self.stop.set()
            # Counted now, not when the stream says so: that waits for the client to read.
            dropped = getattr(self.metrics, "topic_followers_dropped", None)
            if dropped is not None:
                dropped.labels(topic=self.topic).inc()
            return
        self.queue.put_nowait(record)


async def _events(follower: _Follower) -> AsyncIterator[str]:
    """The follower's records as Server-Sent Events; the last event says why the stream
    ended, when the service ended it."""
    followers = getattr(follower.metrics, "topic_followers", None)
    gauge = followers.labels(topic=follower.topic) if followers is not None else None
    if gauge is not None:
        gauge.inc()
    follower.start()
    try:
        yield _event("start", {"topic": follower.topic, "offsets": _offsets(follower.positions)})
        while True:
            if follower.failure is not None:
                yield _event("error", {"code": ConsumeError.code, "error": follower.failure})
                return
            if follower.dropped:
                yield _event(
                    "error",
                    {
                        "code": TopicFollowerTooSlowError.code,
                        "error": (
                            f"the client read {follower.topic!r} too slowly: more than "
                            f"{FOLLOW_QUEUE} records waited for it; follow again, from "
                            "the time of the last record read"
                        ),
                    },
                )
                return
            try:
                record = await asyncio.wait_for(follower.queue.get(), KEEPALIVE_S)
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            if follower.failure is not None:
                continue
            yield _event("record", record, f"{record['partition']}:{record['offset']}")
    finally:
        # The client left (the response was cancelled) or the stream ended.
        follower.stop.set()
        if gauge is not None:
            gauge.dec()


def _offsets(positions: dict[int, int]) -> dict[str, int]:
    return {str(p): o for p, o in sorted(positions.items())}


def _event(name: str, data: dict[str, Any], event_id: str | None = None) -> str:
    head = f"event: {name}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"

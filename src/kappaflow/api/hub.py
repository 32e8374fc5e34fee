"""The push hub: one reader per changelog topic, however many subscribe.

A :class:`Hub` reads an output's topic once, ``read_committed``, folds the records into
the latest record of each Kafka key (the snapshot a new subscriber starts from), and
keeps the most recent records, so that a subscriber that comes back resumes from its last
event id. A subscriber whose position is older than the records the hub keeps is caught
up from Kafka by a reader of its own (:class:`RangeReader`), then joins the hub's stream:
no record is lost or repeated either way. A subscriber more than ``api.push_backlog``
records behind is dropped (KF872) without slowing anyone else: the hub never waits for
a subscriber. The routes that serve subscribers are push.py's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from kappaflow.errors import (
    BadResumePointError,
    NoChangelogError,
    PushUnavailableError,
    SubscriberTooSlowError,
    UnknownOutputError,
)
from kappaflow.jobs.manager import JobManager
from kappaflow.kafka.clients import consumer
from kappaflow.settings import KafkaSettings, Settings

Position = dict[int, int]


#: Records the hub keeps for subscribers that resume; older positions read Kafka.
KEPT_RECORDS = 100_000


#: How long a subscription waits for its hub to have read the topic to its end.
READY_TIMEOUT_S = 30.0


#: A subscriber with no change for this long gets a keep-alive (an SSE comment).
KEEPALIVE_S = 15.0


#: A hub without a subscriber for this long stops, and forgets what it held.
IDLE_S = 300.0


#: Reader errors after which the topic cannot be followed: it was deleted.
_GONE = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION)


_POLL_S = 0.1


_BATCH = 500


def encode_position(position: Position) -> str:
    """An event id: ``partition:next offset`` for each partition, by partition."""
    return ",".join(f"{p}:{o}" for p, o in sorted(position.items()))


def decode_position(text: str) -> Position:
    """The position an event id names, or BadResumePointError."""
    position: Position = {}
    try:
        for part in text.split(","):
            partition, offset = part.split(":")
            position[int(partition)] = int(offset)
    except ValueError:
        raise BadResumePointError(
            f"last event id {text!r} is not a position (partition:offset,...)"
        ) from None
    if any(p < 0 or o < 0 for p, o in position.items()):
        raise BadResumePointError(f"last event id {text!r} has a negative partition or offset")
    return position


@dataclass(frozen=True, slots=True)
class Change:
    """One record of the topic: where it is, its key, its value (JSON text)."""

    partition: int
    offset: int
    key: bytes | None
    value: str


def _change(message: Message) -> Change:
    raw, key = message.value(), message.key()
    value = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else (raw or "null")
    return Change(
        message.partition() or 0,
        message.offset() or 0,
        key.encode() if isinstance(key, str) else key,
        value,
    )


def _removes(change: Change) -> bool:
    """Whether the record ends its key: a window whose values are gone (a session merged
    into another) or a tombstone."""
    if change.value == "null":
        return True
    if '"values"' not in change.value:
        return False
    try:
        value = json.loads(change.value)
    except ValueError:
        return False
    return isinstance(value, dict) and "values" in value and value["values"] is None


@dataclass(frozen=True)
class Subscription:
    """What a subscriber starts from: a snapshot, buffered records, or a Kafka read."""

    #: The hub's position when the subscriber joined.
    position: Position
    #: Where the subscriber resumes (None: from the snapshot).
    resume: Position | None
    snapshot: list[str] | None
    buffered: list[Change]
    #: Partitions to read from Kafka, from the first offset up to the second.
    catch_up: dict[int, tuple[int, int]]


class Subscriber:
    """One subscriber's queue of the hub's records, read on the service's event loop."""

    def __init__(self, hub: Hub, start: Subscription, backlog: int) -> None:
        self.hub = hub
        #: What it starts from, until sent (a snapshot, or kept records, can be large).
        self._start: Subscription | None = start
        self.position = dict(start.position if start.resume is None else start.resume)
        self.backlog = backlog
        self.pending = 0
        self.dropped = False
        #: Why the hub stopped feeding it, if it did.
        self.failure: str | None = None
        self._queue: asyncio.Queue[list[Change] | None] = asyncio.Queue()

    def fail(self, reason: str) -> None:
        """Called on the event loop when the hub can feed it no more."""
        self.failure = reason
        self._queue.put_nowait(None)

    def offer(self, batch: list[Change]) -> None:
        """Called on the event loop with each batch the hub read; never waits."""
        if self.dropped:
            return
        self.pending += len(batch)
        if self.pending > self.backlog:
            self.dropped = True
            while not self._queue.empty():
                self._queue.get_nowait()
            self._queue.put_nowait(None)
            return
        self._queue.put_nowait(batch)

    def close(self) -> None:
        self.hub.unsubscribe(self)

    def _advance(self, change: Change) -> bool:
        """Whether ``change`` is new to this subscriber; if so, its position moves past it."""
        if change.offset < self.position.get(change.partition, 0):
            return False
        self.position[change.partition] = change.offset + 1
        return True

    async def events(self) -> AsyncIterator[list[tuple[str, str, str]]]:
        """The events in order, (event, id, data), a batch of the topic's records at a
        time (an empty one for a keep-alive). SubscriberTooSlowError when the subscriber
        fell ``backlog`` records behind."""
        start, self._start = self._start, None
        if start is None:
            raise RuntimeError("a subscriber's events are read once")
        if start.snapshot is not None:
            items = "[" + ",".join(start.snapshot) + "]"
            yield [("snapshot", encode_position(self.position), '{"items": ' + items + "}")]
        else:
            async for read in self._read_kafka(start.catch_up):
                yield self._new(read)
            if start.buffered:
                yield self._new(start.buffered)
        position = start.position
        del start
        # Everything before the hub's position at subscription has been sent (what is
        # left between are transaction markers).
        for partition, offset in position.items():
            self.position[partition] = max(self.position.get(partition, 0), offset)
        while True:
            try:
                async with asyncio.timeout(KEEPALIVE_S):
                    batch = await self._queue.get()
            except TimeoutError:
                yield []
                continue
            if self.failure is not None:
                raise PushUnavailableError(self.failure)
            if batch is None or self.dropped:
                raise SubscriberTooSlowError(
                    f"dropped: more than {self.backlog} changes behind; resume with the "
                    "last event id"
                )
            self.pending -= len(batch)
            yield self._new(batch)

    def _new(self, batch: list[Change]) -> list[tuple[str, str, str]]:
        """The changes of ``batch`` this subscriber has not had, as events."""
        events = []
        for change in batch:
            if self._advance(change):
                events.append(("change", encode_position(self.position), change.value))
        return events

    async def _read_kafka(self, ranges: dict[int, tuple[int, int]]) -> AsyncIterator[list[Change]]:
        """The records of ``ranges`` (partition: first offset, end), read from Kafka by a
        reader of this subscriber's own, in partition order."""
        if not ranges:
            return
        loop, pool = asyncio.get_running_loop(), self.hub.readers
        # Kafka's client blocks: it runs on the push readers' own threads.
        reader = await loop.run_in_executor(
            pool, RangeReader, self.hub.kafka, self.hub.topic, ranges
        )
        try:
            while True:
                batch = await loop.run_in_executor(pool, reader.next_batch)
                if batch is None:
                    return
                yield batch
        finally:
            await loop.run_in_executor(pool, reader.close)


class RangeReader:
    """Reads offset ranges of a topic's partitions, ``read_committed``, then stops."""

    def __init__(self, kafka: KafkaSettings, topic: str, ranges: dict[int, tuple[int, int]]):
        self.topic = topic
        self.ends = {p: end for p, (first, end) in ranges.items() if first < end}
        self.client = consumer(kafka, **{"enable.partition.eof": False})
        self.client.assign([TopicPartition(topic, p, ranges[p][0]) for p in self.ends])
        self.timeout_s = kafka.timeout_s

    def _done(self) -> bool:
        if not self.ends:
            return True
        positions = self.client.position([TopicPartition(self.topic, p) for p in self.ends])
        return all(tp.offset >= self.ends[tp.partition] for tp in positions)

    def next_batch(self) -> list[Change] | None:
        """The next records, or None once every range is read."""
        waited = 0.0
        while not self._done():
            messages = self.client.consume(_BATCH, timeout=_POLL_S)
            read = [_change(m) for m in messages if m.error() is None]
            found = [c for c in read if c.offset < self.ends.get(c.partition, -1)]
            if found:
                return found
            waited = 0.0 if messages else waited + _POLL_S
            if waited > self.timeout_s:
                raise PushUnavailableError(
                    f"reading {self.topic!r} to resume took longer than {self.timeout_s:.0f} s"
                )
        return None

    def close(self) -> None:
        self.client.close()


@dataclass
class Hub:
    """The one reader of a topic in the service, and the subscribers it feeds."""

    kafka: KafkaSettings
    topic: str
    loop: asyncio.AbstractEventLoop
    kept: int = KEPT_RECORDS
    position: Position = field(default_factory=dict)
    #: Each partition's first offset the kept records hold everything from.
    base: Position = field(default_factory=dict)
    latest: dict[bytes, str] = field(default_factory=dict)
    records: deque[Change] = field(default_factory=deque)
    subscribers: set[Subscriber] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Set once the reader reached the topic's end, or failed (then ``failure`` says why).
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: threading.Event = field(default_factory=threading.Event)
    failure: str | None = None
    #: Each partition's log start when the hub began: older positions are gone.
    low: Position = field(default_factory=dict)
    #: Threads for the subscribers' own Kafka reads (resuming from old positions).
    readers: ThreadPoolExecutor | None = None
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"push:{self.topic}", daemon=True)
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.failure is None and self.thread is not None and self.thread.is_alive()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        try:
            client = consumer(self.kafka, **{"enable.partition.eof": True})
            try:
                self._read(client)
            finally:
                client.close()
        except Exception as exc:  # Kafka gone, a record it cannot take: say so to all
            self._fail(f"reading {self.topic!r} failed: {exc}")

    def _fail(self, reason: str) -> None:
        """Stops feeding: waiting subscriptions and subscribers learn why (KF873)."""
        if self.failure is None:
            self.failure = reason
        self._settle()

        def tell() -> None:
            for subscriber in list(self.subscribers):
                subscriber.fail(reason)

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
            self.loop.call_soon_threadsafe(tell)

    def _settle(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.settled.set)

    def _read(self, client: Any) -> None:
        metadata = client.list_topics(self.topic, timeout=self.kafka.timeout_s)
        described = metadata.topics.get(self.topic)
        if described is None or described.error is not None or not described.partitions:
            self._fail(f"topic {self.topic!r} cannot be read: {described and described.error}")
            return
        partitions = sorted(described.partitions)
        with self.lock:
            for p in partitions:
                low, _ = client.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=self.kafka.timeout_s
                )
                self.position[p] = self.base[p] = self.low[p] = max(low, 0)
        client.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        settled = False
        idle_since = time.monotonic()
        while not self.stopping.is_set():
            if self.subscribers:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_S:
                # Nobody for a while: its memory goes; the next subscriber starts anew.
                self._fail(f"the reader of {self.topic!r} stopped after {IDLE_S:.0f} s idle")
                return
            messages = client.consume(_BATCH, timeout=_POLL_S)
            batch: list[Change] = []
            with self.lock:
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            at_end.add(message.partition() or 0)
                        elif error.fatal() or error.code() in _GONE:
                            raise KafkaException(error)
                        continue
                    change = _change(message)
                    self._apply(change)
                    batch.append(change)
            if not settled and at_end >= set(partitions):
                settled = True
                self._settle()
            if batch:
                self.loop.call_soon_threadsafe(self._dispatch, batch)

    def _apply(self, change: Change) -> None:
        self.position[change.partition] = change.offset + 1
        if change.key is not None:
            if _removes(change):
                self.latest.pop(change.key, None)
            else:
                self.latest.pop(change.key, None)  # re-inserted last: the snapshot's order
                self.latest[change.key] = change.value
        self.records.append(change)
        if len(self.records) > self.kept:
            gone = self.records.popleft()
            self.base[gone.partition] = gone.offset + 1

    def _dispatch(self, batch: list[Change]) -> None:
        for subscriber in list(self.subscribers):
            subscriber.offer(batch)

    async def subscribe(self, last_event_id: str | None, backlog: int) -> Subscriber:
        """A subscriber from the latest snapshot, or resuming at ``last_event_id``."""
        resume = decode_position(last_event_id) if last_event_id is not None else None
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                await self.settled.wait()
        except TimeoutError:
            raise PushUnavailableError(
                f"the changes in {self.topic!r} were not read within {READY_TIMEOUT_S:.0f} s"
            ) from None
        if self.failure is not None:
            raise PushUnavailableError(self.failure)
        with self.lock:
            start = self._start(resume)
            subscriber = Subscriber(self, start, backlog)
            self.subscribers.add(subscriber)
        return subscriber

    def _start(self, resume: Position | None) -> Subscription:
        position = dict(self.position)
        if resume is None:
            return Subscription(position, None, list(self.latest.values()), [], {})
        unknown = sorted(set(resume) - set(position))
        ahead = [p for p, o in resume.items() if p in position and o > position[p]]
        if unknown or ahead:
            raise BadResumePointError(
                f"last event id {encode_position(resume)!r} is not a position of "
                f"{self.topic!r} (now at {encode_position(position)})"
            )
        # A partition the id leaves out (added since) is read from its start.
        wanted = {p: resume.get(p, self.low[p]) for p in position}
        gone = [p for p in position if wanted[p] < self.low[p]]
        if gone:
            raise BadResumePointError(
                f"last event id {encode_position(resume)!r} is older than what {self.topic!r} "
                f"keeps (it starts at {encode_position(self.low)}): subscribe without an id "
                "for a snapshot"
            )
        if all(wanted[p] >= self.base[p] for p in position):
            buffered = [c for c in self.records if c.offset >= wanted[c.partition]]
            return Subscription(position, wanted, None, buffered, {})
        catch_up = {p: (wanted[p], position[p]) for p in position}
        return Subscription(position, wanted, None, [], catch_up)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.discard(subscriber)


class PushHubs:
    """The service's hubs, one per topic, started by the first subscriber."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.jobs = JobManager(settings)
        self._hubs: dict[str, Hub] = {}
        self.readers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="push-resume")

    def topic(self, job: str, output: str) -> str:
        """The Kafka topic the job's output writes (KF601, KF852, KF870)."""
        self.jobs.get(job)
        outputs = {o["name"]: o for o in self.jobs.plan(job)["outputs"]}
        if output not in outputs:
            raise UnknownOutputError(
                f"job {job!r} has no output {output!r} "
                f"(its outputs: {', '.join(outputs) or 'none recorded'})"
            )
        topics = [s["kafka"] for s in outputs[output]["sinks"] if "kafka" in s]
        if not topics:
            raise NoChangelogError(
                f"output {output!r} of job {job!r} writes no Kafka topic, where its changes "
                "are pushed from: add kf.topic() to its sinks"
            )
        return str(topics[0])

    def hub(self, topic: str) -> Hub:
        hub = self._hubs.get(topic)
        if hub is None or not hub.alive:
            if hub is not None:
                hub.stop()
            hub = Hub(self.settings.kafka, topic, asyncio.get_running_loop(), readers=self.readers)
            self._hubs[topic] = hub
            hub.start()
        return hub

    def find(self, topic: str) -> Hub | None:
        """The hub of ``topic``, if a subscriber started it."""
        return self._hubs.get(topic)

    def close(self) -> None:
        for hub in self._hubs.values():
            hub.stop()
        self._hubs.clear()
        self.readers.shutdown(wait=False, cancel_futures=True)

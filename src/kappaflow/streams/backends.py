"""The systems a job's batch writer writes to: Kafka (transactions) and Redis.

Each has an in-memory twin with the same contract, which the test harness
(kappaflow.testing) uses so that a job's tests need no broker and no Redis.

Kafka: a batch's records, on every topic, go out in one transaction together with a
marker in the job's compacted ``JOB.commits`` topic (key: the output's name); a batch
whose marker is committed is not published again, and the fixed transactional id fences
off the producer of a driver that died mid-transaction. Redis: writes are idempotent (a
re-run batch writes the same values again), and statistics move only for a batch id
above the last one applied.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis as redis_lib
from confluent_kafka import KafkaException

from kappaflow.errors import ProduceError
from kappaflow.kafka.clients import transactional_producer
from kappaflow.kafka.records import StartAt, produce_with_retry, read_records
from kappaflow.settings import Settings

#: A record to publish: topic, key, value.
Record = tuple[str, bytes | None, bytes]
#: Called inside the transaction, after the records are sent and before the commit.
InTransaction = Callable[[], None]


class Publisher(Protocol):
    def committed(self, output: str) -> dict[str, Any] | None:
        """The marker of ``output``'s last committed batch (``batch_id`` and the output's
        running totals), or None before its first."""
        ...

    def publish(
        self,
        output: str,
        batch_id: int,
        records: Sequence[Record],
        marker: dict[str, Any],
        in_transaction: InTransaction | None = None,
    ) -> None:
        """``records`` and the batch's marker, atomically."""
        ...


class ResultStore(Protocol):
    def apply(
        self, output: str, batch_id: int, changes: Sequence[dict[str, Any]], stats: dict[str, int]
    ) -> None:
        """Each change's values under its key and window; ``stats`` added once per batch."""
        ...


def commits_topic(job: str) -> str:
    return f"{job}.commits"


class KafkaPublisher:
    """Transactions of one job, from its driver (transactional id ``kappaflow.job.JOB``)."""

    def __init__(self, settings: Settings, job: str) -> None:
        self.settings = settings
        self.job = job
        self.producer = transactional_producer(settings.kafka, f"kappaflow.job.{job}")
        self._committed = self._read_markers()

    def committed(self, output: str) -> dict[str, Any] | None:
        return self._committed.get(output)

    def publish(
        self,
        output: str,
        batch_id: int,
        records: Sequence[Record],
        marker: dict[str, Any],
        in_transaction: InTransaction | None = None,
    ) -> None:
        producer = self.producer
        producer.begin_transaction()
        try:
            for topic, key, value in records:
                produce_with_retry(producer, topic, value, key, poll_s=0.2)
            marker = {"output": output, "batch_id": batch_id, **marker}
            body = json.dumps(marker).encode()
            produce_with_retry(producer, commits_topic(self.job), body, output.encode())
            producer.flush(120)
            if in_transaction is not None:
                in_transaction()
            producer.commit_transaction(120)
        except KafkaException as exc:
            producer.abort_transaction(60)
            raise ProduceError(f"publishing batch {batch_id} of {output} failed: {exc}") from None
        self._committed[output] = marker

    def _read_markers(self) -> dict[str, dict[str, Any]]:
        """The last committed batch of every output, from ``JOB.commits``: the log up to
        its end now, read ``read_committed`` so that an aborted batch's marker is not one."""
        found: dict[str, dict[str, Any]] = {}
        start = StartAt(beginning=True)
        for message in read_records(self.settings.kafka, commits_topic(self.job), start=start):
            marker = json.loads(message.value() or b"{}")
            name = str(marker["output"])
            if marker["batch_id"] > found.get(name, {}).get("batch_id", -1):
                found[name] = marker
        return found


@dataclass
class MemoryPublisher:
    """Kafka's twin for the test harness: committed records per topic, in order."""

    topics: dict[str, list[tuple[bytes | None, bytes]]] = field(default_factory=dict)
    markers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def committed(self, output: str) -> dict[str, Any] | None:
        return self.markers.get(output)

    def publish(
        self,
        output: str,
        batch_id: int,
        records: Sequence[Record],
        marker: dict[str, Any],
        in_transaction: InTransaction | None = None,
    ) -> None:
        if in_transaction is not None:
            in_transaction()
        for topic, key, value in records:
            self.topics.setdefault(topic, []).append((key, value))
        self.markers[output] = {"output": output, "batch_id": batch_id, **marker}


# Writes a chunk of changes. KEYS: none. ARGV: the prefix (``kf:JOB:OUTPUT:``), then a
# JSON array holding three strings per change: key, window start, the window's JSON (empty
# for a retraction: a session merged into another, or whose start moved, is removed).
_WRITE = """
local prefix = ARGV[1]
local items = cjson.decode(ARGV[2])
for i = 1, #items, 3 do
  if items[i + 2] == '' then
    redis.call('HDEL', prefix .. 'w:' .. items[i], items[i + 1])
  else
    redis.call('HSET', prefix .. 'w:' .. items[i], items[i + 1], items[i + 2])
    redis.call('SADD', prefix .. 'keys', items[i])
  end
end
return #items / 3
"""
# Adds a batch's statistics once. ARGV: the stats key, batch id, then name/value pairs.
_STATS = """
local last = tonumber(redis.call('HGET', ARGV[1], 'batch') or '-1')
if tonumber(ARGV[2]) <= last then return 0 end
for i = 3, #ARGV, 2 do redis.call('HINCRBY', ARGV[1], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', ARGV[1], 'batch', ARGV[2])
return 1
"""
_CHUNK = 10_000


def redis_prefix(job: str, output: str) -> str:
    """The prefix of an output's keys in the serving store."""
    return f"kf:{job}:{output}:"


class RedisStore:
    """An output's windows in Redis: ``kf:JOB:OUTPUT:w:KEY`` (a hash: window start →
    ``{"end", "values", "version", "final"}``), ``kf:JOB:OUTPUT:keys`` and
    ``kf:JOB:OUTPUT:stats``."""

    def __init__(self, client: redis_lib.Redis, job: str) -> None:
        self.client = client
        self.job = job
        self._write = client.register_script(_WRITE)
        self._stats = client.register_script(_STATS)

    def apply(
        self, output: str, batch_id: int, changes: Sequence[dict[str, Any]], stats: dict[str, int]
    ) -> None:
        prefix = redis_prefix(self.job, output)
        for low in range(0, len(changes), _CHUNK):
            items: list[str] = []
            for change in changes[low : low + _CHUNK]:
                held = "" if change["values"] is None else window_json(change)
                items += [change["key"], str(change["window_start"]), held]
            self._write(args=[prefix, json.dumps(items)])
        pairs = [str(x) for name, value in sorted(stats.items()) for x in (name, value)]
        self._stats(args=[prefix + "stats", batch_id, *pairs])


def window_json(change: dict[str, Any]) -> str:
    """What the store holds for a window of a key."""
    return json.dumps(
        {
            "end": change["window_end"],
            "values": change["values"],
            "version": change["version"],
            "final": change["final"],
        },
        separators=(",", ":"),
    )


@dataclass
class MemoryStore:
    """Redis's twin for the test harness: per output, key and window, the current value."""

    windows: dict[str, dict[tuple[str, int], dict[str, Any]]] = field(default_factory=dict)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    applied: dict[str, int] = field(default_factory=dict)

    def apply(
        self, output: str, batch_id: int, changes: Sequence[dict[str, Any]], stats: dict[str, int]
    ) -> None:
        held = self.windows.setdefault(output, {})
        for change in changes:
            window = (change["key"], change["window_start"])
            if change["values"] is None:  # a retracted session
                held.pop(window, None)
            else:
                held[window] = json.loads(window_json(change))
        if batch_id > self.applied.get(output, -1):
            totals = self.stats.setdefault(output, {})
            for name, value in stats.items():
                totals[name] = totals.get(name, 0) + value
            self.applied[output] = batch_id

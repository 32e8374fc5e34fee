"""The systems a job's batch writer writes to: Kafka (transactions) and Redis.

Each has an in-memory twin with the same contract, which the test harness
(kappaflow.testing) uses so that a job's tests need no broker and no Redis.

Kafka: the tasks holding a batch's records write them, each its partition of the batch
in a transaction of its own with a marker of that partition in the job's compacted
``JOB.commits`` topic (key ``OUTPUT#pN``; KafkaOutput.java in the engine jar); a
partition whose marker is committed is not written again. A task's marker names the
batch it wrote ``written_batch``; its ``batch_id`` is the output's batch committed before
(so the topic's highest ``batch_id`` is always an output's own marker). Then the driver commits the
output's marker for the batch (key: the output's name) in a transaction of its own; a
batch whose marker is committed is not published again, and the fixed transactional ids
fence off the producers of a driver that died mid-transaction. Redis: writes are idempotent (a
re-run batch writes the same values again), and statistics move only for a batch id
above the last one applied.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import redis as redis_lib
from confluent_kafka import KafkaException, TopicPartition
from pyspark.sql import DataFrame

from kappaflow.errors import ProduceError
from kappaflow.kafka.clients import consumer, transactional_producer
from kappaflow.kafka.records import StartAt, produce_with_retry, read_records
from kappaflow.serving.client import redis_prefix
from kappaflow.settings import Settings
from kappaflow.streams.jvm import jvm_engine
from kappaflow.streams.output.json_columns import booleans, join, number_text

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

    def write(self, output: str, batch_id: int, records: DataFrame) -> int:
        """``records`` (columns ``topic``, ``key`` and ``value``), each partition of them
        once for ``batch_id``, from the tasks holding it; how many records the batch has
        (those written before included)."""
        ...


@dataclass(frozen=True)
class BatchAccount:
    """What one batch adds to an output's bookkeeping in the store, once."""

    #: Running totals to add to (events, duplicates, late, dead letters).
    stats: dict[str, int]
    #: The batch's watermark (epoch ms), kept if it is the highest yet.
    watermark: int
    #: Window start → change in the keys the output's state holds for it.
    held: dict[int, int]


class ResultStore(Protocol):
    def apply(
        self,
        output: str,
        batch_id: int,
        changes: pa.Table,
        account: BatchAccount,
        latest: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Each change's values under its key and window (``changes`` has the columns
        ``kind``, ``key``, ``window_start``, ``window_end``, ``values``, ``version`` and
        ``watermark``, in order), each of a keyed stream's records (``latest``: key JSON,
        record JSON, in order) as its key's latest, and ``account`` once per batch id."""
        ...

    def write(self, output: str, rows: DataFrame) -> int:
        """A batch's writes (``task_records.store_windows`` or ``store_latest`` rows),
        from the tasks holding them, each partition's at once; how many."""
        ...

    def account(self, output: str, batch_id: int, account: BatchAccount) -> None:
        """``account`` once per batch id."""
        ...


def commits_topic(job: str) -> str:
    return f"{job}.commits"


def is_task_marker(marker: dict[str, Any]) -> bool:
    """Whether a record of ``JOB.commits`` is a task's marker of its partition of a batch
    (not an output's marker of a whole batch)."""
    return "partition" in marker


#: How many transactional ids past a batch's partitions the first batch of a run fences.
_FENCE_MARGIN = 8


class KafkaPublisher:
    """Transactions of one job: the driver's (transactional id ``kappaflow.job.JOB``)
    for the outputs' markers, and the tasks' for the records (KafkaOutput.java)."""

    def __init__(self, settings: Settings, job: str) -> None:
        self.settings = settings
        self.job = job
        self.producer = transactional_producer(settings.kafka, f"kappaflow.job.{job}")
        self._committed = self._read_markers()
        self._turn = threading.Lock()
        self._fenced: set[str] = set()
        self._ends = consumer(settings.kafka)

    def committed(self, output: str) -> dict[str, Any] | None:
        return self._committed.get(output)

    def write(self, output: str, batch_id: int, records: DataFrame) -> int:
        spark = records.sparkSession
        engine = jvm_engine(spark)
        config = json.dumps(self._java_config())
        if output not in self._fenced:
            # What tasks of a driver that died left open is aborted before any task reads
            # the markers (a task would wait for a transaction no one ends).
            partitions = records._jdf.rdd().getNumPartitions()
            engine.KafkaOutput.fence(self.job, output, partitions + _FENCE_MARGIN, config)
            self._fenced.add(output)
        # The markers of this batch's partitions are past where the last batch's ended.
        last = self._committed.get(output) or {}
        since = last.get("tasks_from", {})
        done = json.loads(
            engine.KafkaOutput.write(
                records._jdf,
                self.job,
                output,
                batch_id,
                int(last.get("batch_id", -1)),
                commits_topic(self.job),
                json.dumps(since),
                config,
            )
        )
        return int(done["records"])

    def _java_config(self) -> dict[str, str]:
        return self.java_config(self.settings)

    @staticmethod
    def java_config(settings: Settings) -> dict[str, str]:
        """The Java client's properties for this cluster: the settings the Python
        clients use (bootstrap, security), in the Java client's names."""
        prefix = "kafka."
        options = settings.kafka.spark_kafka_options()
        return {k.removeprefix(prefix): v for k, v in options.items()}

    def _marker_ends(self) -> dict[str, int]:
        """The end of each partition of ``JOB.commits`` now (tasks' transactions of the
        batch included: they are committed)."""
        topic = commits_topic(self.job)
        meta = self._ends.list_topics(topic, timeout=30).topics[topic]
        ends = {}
        for partition in sorted(meta.partitions):
            _, high = self._ends.get_watermark_offsets(TopicPartition(topic, partition), 30)
            ends[str(partition)] = int(high)
        return ends

    def publish(
        self,
        output: str,
        batch_id: int,
        records: Sequence[Record],
        marker: dict[str, Any],
        in_transaction: InTransaction | None = None,
    ) -> None:
        producer = self.producer
        # One producer, one transaction at a time: the outputs' queries run side by side
        # and each publishes from its own thread, so their transactions take turns.
        with self._turn:
            marker = {
                "output": output,
                "batch_id": batch_id,
                **marker,
                "tasks_from": self._marker_ends(),
            }
            producer.begin_transaction()
            try:
                for topic, key, value in records:
                    produce_with_retry(producer, topic, value, key, poll_s=0.2)
                body = json.dumps(marker).encode()
                produce_with_retry(producer, commits_topic(self.job), body, output.encode())
                producer.flush(120)
                if in_transaction is not None:
                    in_transaction()
                producer.commit_transaction(120)
            except KafkaException as exc:
                producer.abort_transaction(60)
                raise ProduceError(
                    f"publishing batch {batch_id} of {output} failed: {exc}"
                ) from None
            self._committed[output] = marker

    def _read_markers(self) -> dict[str, dict[str, Any]]:
        """The last committed batch of every output, from ``JOB.commits``: the log up to
        its end now, read ``read_committed`` so that an aborted batch's marker is not one."""
        found: dict[str, dict[str, Any]] = {}
        start = StartAt(beginning=True)
        for message in read_records(self.settings.kafka, commits_topic(self.job), start=start):
            marker = json.loads(message.value() or b"{}")
            if is_task_marker(marker):
                continue
            name = str(marker["output"])
            if marker["batch_id"] > found.get(name, {}).get("batch_id", -1):
                found[name] = marker
        return found


@dataclass
class MemoryPublisher:
    """Kafka's twin for the test harness: committed records per topic, in order.

    A twin in the driver's memory: ``write`` collects the batch's records to it (the
    harness's batches are small), each partition once, as the tasks' writer does."""

    topics: dict[str, list[tuple[bytes | None, bytes]]] = field(default_factory=dict)
    markers: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The (output, batch, partition) written.
    partitions: set[tuple[str, int, int]] = field(default_factory=set)

    def write(self, output: str, batch_id: int, records: DataFrame) -> int:
        from pyspark.sql import functions as F

        table = records.select(
            F.spark_partition_id().alias("_p"), "topic", "key", "value", "_o1", "_o2", "_o3"
        ).toArrow()
        rows = table.to_pylist()
        fresh = [r for r in rows if (output, batch_id, r["_p"]) not in self.partitions]
        fresh.sort(
            key=lambda r: (r["topic"], r["_o1"] is not None, r["_o1"] or "", r["_o2"], r["_o3"])
        )
        for r in fresh:
            self.topics.setdefault(r["topic"], []).append((r["key"], r["value"]))
        self.partitions.update((output, batch_id, r["_p"]) for r in rows)
        return len(rows)

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


# Writes a chunk of changes. KEYS: none. ARGV: the prefix (``kf:JOB:OUTPUT:``), then three
# strings per change: key, window start, the window's JSON (empty for a retraction: a
# session merged into another, or whose start moved, is removed).
_WRITE = """
local prefix = ARGV[1]
for i = 2, #ARGV, 3 do
  if ARGV[i + 2] == '' then
    redis.call('HDEL', prefix .. 'w:' .. ARGV[i], ARGV[i + 1])
  else
    redis.call('HSET', prefix .. 'w:' .. ARGV[i], ARGV[i + 1], ARGV[i + 2])
    redis.call('SADD', prefix .. 'keys', ARGV[i])
  end
end
return (#ARGV - 1) / 3
"""
# Writes a chunk of a keyed stream's records, each its key's latest. ARGV: the hash
# (``kf:JOB:OUTPUT:latest``), then key and record pairs, in order.
_LATEST = """
for i = 2, #ARGV, 2 do redis.call('HSET', ARGV[1], ARGV[i], ARGV[i + 1]) end
return (#ARGV - 1) / 2
"""
# Adds a batch's statistics once. ARGV: the stats key, batch id, watermark, the open
# windows' key, their changes (JSON: window start → keys held), then name/value pairs.
_STATS = """
local last = tonumber(redis.call('HGET', ARGV[1], 'batch') or '-1')
if tonumber(ARGV[2]) <= last then return 0 end
for i = 6, #ARGV, 2 do redis.call('HINCRBY', ARGV[1], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', ARGV[1], 'batch', ARGV[2])
if tonumber(ARGV[3]) > tonumber(redis.call('HGET', ARGV[1], 'watermark') or '0') then
  redis.call('HSET', ARGV[1], 'watermark', ARGV[3])
end
for window, delta in pairs(cjson.decode(ARGV[5])) do
  if redis.call('HINCRBY', ARGV[4], window, delta) <= 0 then
    redis.call('HDEL', ARGV[4], window)
  end
end
return 1
"""
_CHUNK = 10_000


def read_latest(
    client: redis_lib.Redis, job: str, output: str
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """A keyed stream output's latest record per key, as the serving store holds them."""
    held = client.hgetall(redis_prefix(job, output) + "latest")
    return {tuple(json.loads(k)): json.loads(v) for k, v in held.items()}


class RedisStore:
    """An output's windows in Redis: ``kf:JOB:OUTPUT:w:KEY`` (a hash: window start →
    ``{"end", "values", "version", "final"}``), ``kf:JOB:OUTPUT:keys``; a keyed stream's
    latest record per key in ``kf:JOB:OUTPUT:latest`` (a hash: key JSON → record JSON); and
    ``kf:JOB:OUTPUT:stats`` (events, duplicates, late, dead_letters: running totals;
    ``batch``: the last batch applied; ``watermark``: the highest, epoch ms) and
    ``kf:JOB:OUTPUT:open`` (window start → keys the state still holds for it; a session
    aggregate counts its sessions under ``-2``)."""

    def __init__(self, client: redis_lib.Redis, job: str) -> None:
        self.client = client
        self.job = job
        self._write = client.register_script(_WRITE)
        self._latest = client.register_script(_LATEST)
        self._stats = client.register_script(_STATS)

    def apply(
        self,
        output: str,
        batch_id: int,
        changes: pa.Table,
        account: BatchAccount,
        latest: Sequence[tuple[str, str]] = (),
    ) -> None:
        prefix = redis_prefix(self.job, output)
        # A batch run again writes the same records: the latest of each key is the same.
        for low in range(0, len(latest), _CHUNK):
            pairs: list[str] = [prefix + "latest"]
            for key, record in latest[low : low + _CHUNK]:
                pairs += (key, record)
            self._latest(args=pairs)
        keys, starts, texts = stored_windows(changes)
        for low in range(0, len(keys), _CHUNK):
            items: list[str] = [prefix]
            end = low + _CHUNK
            for item in zip(keys[low:end], starts[low:end], texts[low:end], strict=True):
                items += item
            self._write(args=items)
        self.account(output, batch_id, account)

    def write(self, output: str, rows: DataFrame) -> int:
        engine = jvm_engine(rows.sparkSession)
        url, username, password = self._address()
        prefix = redis_prefix(self.job, output)
        return int(engine.RedisOutput.write(rows._jdf, prefix, url, username, password))

    def account(self, output: str, batch_id: int, account: BatchAccount) -> None:
        prefix = redis_prefix(self.job, output)
        pairs = [str(x) for name, value in sorted(account.stats.items()) for x in (name, value)]
        opened = json.dumps({str(w): n for w, n in account.held.items() if n})
        stats, watermark = prefix + "stats", account.watermark
        self._stats(args=[stats, batch_id, watermark, prefix + "open", opened, *pairs])

    def address(self) -> tuple[str, str | None, str | None]:
        """The URL, user and password the tasks' clients reach Redis with."""
        return self._address()

    def _address(self) -> tuple[str, str | None, str | None]:
        """The URL, user and password the driver's client reaches Redis with, for the
        tasks' client."""
        pool = self.client.connection_pool
        given = pool.connection_kwargs
        tls = issubclass(pool.connection_class, redis_lib.SSLConnection)
        scheme = "rediss" if tls else "redis"
        url = f"{scheme}://{given.get('host', 'localhost')}:{given.get('port', 6379)}"
        return f"{url}/{given.get('db', 0)}", given.get("username"), given.get("password")


def stored_windows(changes: pa.Table) -> tuple[list[str], list[str], list[str]]:
    """Per change, its key, its window's start and what the store holds for the window:
    ``{"end", "values", "version", "final"}`` as JSON, or ``""`` for a retraction (a
    change without values). Built a column at a time: a batch may change 100,000s."""
    kind, end = changes["kind"], changes["window_end"]
    final = pc.or_(
        pc.equal(kind, "final"),
        pc.and_(pc.equal(kind, "correction"), pc.less_equal(end, changes["watermark"])),
    )
    values = changes["values"]
    held = join(
        '{"end":',
        number_text(end),
        ',"values":',
        values,
        ',"version":',
        number_text(changes["version"]),
        ',"final":',
        booleans(final),
        "}",
    )
    held = pc.if_else(pc.is_null(values), "", held)
    return (
        changes["key"].to_pylist(),
        number_text(changes["window_start"]).to_pylist(),
        held.to_pylist(),
    )


@dataclass
class MemoryStore:
    """Redis's twin for the test harness: per output, key and window, the current value."""

    windows: dict[str, dict[tuple[str, int], dict[str, Any]]] = field(default_factory=dict)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per output, window start → keys its state holds (sessions: all under one entry).
    open: dict[str, dict[int, int]] = field(default_factory=dict)
    applied: dict[str, int] = field(default_factory=dict)
    #: Per output, a keyed stream's latest record per key (key JSON → record).
    latest: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def apply(
        self,
        output: str,
        batch_id: int,
        changes: pa.Table,
        account: BatchAccount,
        latest: Sequence[tuple[str, str]] = (),
    ) -> None:
        newest = self.latest.setdefault(output, {})
        for key, record in latest:
            newest[key] = json.loads(record)
        windows = self.windows.setdefault(output, {})
        for key, start, text in zip(*stored_windows(changes), strict=True):
            window = (key, int(start))
            if not text:  # a retracted session
                windows.pop(window, None)
            else:
                windows[window] = json.loads(text)
        self.account(output, batch_id, account)

    def write(self, output: str, rows: DataFrame) -> int:
        """Collects the batch's writes: the twin lives in the driver's memory."""
        found = rows.select("target", "key", "field", "value").toArrow().to_pylist()
        windows = self.windows.setdefault(output, {})
        newest = self.latest.setdefault(output, {})
        for row in found:
            if row["target"] == "latest":
                newest[row["field"]] = json.loads(row["value"])
            elif not row["value"]:  # a retracted session
                windows.pop((row["key"], int(row["field"])), None)
            else:
                windows[(row["key"], int(row["field"]))] = json.loads(row["value"])
        return len(found)

    def account(self, output: str, batch_id: int, account: BatchAccount) -> None:
        if batch_id > self.applied.get(output, -1):
            totals = self.stats.setdefault(output, {})
            for name, value in account.stats.items():
                totals[name] = totals.get(name, 0) + value
            totals["watermark"] = max(totals.get("watermark", 0), account.watermark)
            opened = self.open.setdefault(output, {})
            for window_start, n in account.held.items():
                opened[window_start] = opened.get(window_start, 0) + n
                if opened[window_start] <= 0:
                    del opened[window_start]
            self.applied[output] = batch_id

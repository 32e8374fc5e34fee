"""A batch's outputs written by Spark's tasks: records formatted in Spark SQL with the bytes
the driver-side formatting made, each (batch, partition) written to Kafka once by the
engine jar's transactional writer (a zombie attempt fenced), and a large batch written
without its rows ever reaching the driver's Python process."""

from __future__ import annotations

import base64
import json
import resource
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

from kappaflow.kafka.clients import transactional_producer
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.kafka.topics import create_topic
from kappaflow.settings import Settings
from kappaflow.streams.jvm import jvm_engine
from kappaflow.streams.model import Source
from kappaflow.streams.output.backends import (
    KafkaPublisher,
    MemoryPublisher,
    MemoryStore,
    commits_topic,
)
from kappaflow.streams.output.task_records import changelog, dead_letters
from kappaflow.streams.output.writer import OutputTarget, OutputWriter, changelog_records
from kappaflow.streams.runtime import _shaped
from kappaflow.streams.schema import RecordSchema
from test_changelog_records import MINUTE, START, changes


def _changes(
    spark: SparkSession, keys: list[str], **columns: list[Any]
) -> tuple[pa.Table, DataFrame]:
    """The changes of ``changes`` (test_changelog_records), and as a shaped frame."""
    table = changes(keys, **columns)
    return table, _shaped(spark.createDataFrame(table))


def _rows(frame: DataFrame) -> list[tuple[str, bytes | None, bytes]]:
    return [(r["topic"], r["key"], r["value"]) for r in frame.collect()]


def test_changelog_records_from_the_tasks_are_the_drivers_byte_for_byte(
    spark: SparkSession,
) -> None:
    keys = [
        '["a \\"quoted\\", page",3]',
        "[null,-1.5]",
        '["caf\u00e9 \\u2603",12345678901234567890]',
        '["tab\\there",1.0E20]',
        '["x",1.0E-5]',
        '["y",0.0001]',
    ]
    table, frame = _changes(
        spark,
        keys,
        kind=["correction", "final", "provisional", "final", "final", "final"],
        values=['{"n":2,"mean":1.5}', '{"n":1}', None, '{"n":3}', '{"n":4}', '{"n":5}'],
        previous=['{"n":1,"mean":1.0}', '{"n":1}', '{"n":9}', None, None, None],
        version=[3, 2, 1, 1, 7, 1],
        watermark=[0, START + MINUTE, START, START, START, 1],
        window_start=[START, START, START - MINUTE, START, 0, START],
        window_end=[START + MINUTE, START + MINUTE, START, START + MINUTE, MINUTE, START + 1],
    )
    names = ("page", "size")
    expected = changelog_records("out", names, table, 7)
    assert sorted(_rows(changelog(frame.coalesce(1), ("out",), names, 7))) == sorted(expected)

    single, frame = _changes(spark, ['["/\u00e9"]', "[null]", "[7]"])
    expected = changelog_records("out", ("page",), single, 0)
    got = _rows(changelog(frame, ("out", "copy"), ("page",), 0))
    assert sorted(r for r in got if r[0] == "out") == sorted(expected)
    assert len(got) == 6

    none, frame = _changes(spark, ["[]"])
    assert _rows(changelog(frame, ("out",), (), 0)) == changelog_records("out", (), none, 0)


def test_dead_letters_from_the_tasks_carry_the_bytes_in_base64(spark: SparkSession) -> None:
    raw = b'{"user": "bob", "ms": 90000}' * 5 + b"\xff\x00"
    rows = spark.createDataFrame(
        [("dlq", 'ms \u00e9 is "over"\n', raw, 2, 41), ("dlq", None, None, None, None)],
        "kind string, reason string, value binary, src_partition int, src_offset bigint",
    )
    letters = _rows(
        dead_letters(_shaped(rows), "j.dlq", job="j", schema="Click", source_topic="clicks")
    )
    expected = [
        {
            "error": reason,
            "schema": "Click",
            "job": "j",
            "source_topic": "clicks",
            "source_partition": partition,
            "source_offset": offset,
            "value_base64": base64.b64encode(value).decode() if value else None,
        }
        for reason, value, partition, offset in [
            ('ms \u00e9 is "over"\n', raw, 2, 41),
            (None, None, None, None),
        ]
    ]
    assert sorted(letters) == sorted(("j.dlq", None, json.dumps(e).encode()) for e in expected)


# -- the Kafka writer, driven directly -----------------------------------------------------


def _values(settings: Settings, topic: str) -> list[bytes]:
    return [
        m.value() or b"" for m in read_records(settings.kafka, topic, start=StartAt(beginning=True))
    ]


def _config(settings: Settings) -> str:
    options = settings.kafka.spark_kafka_options()
    return json.dumps({k.removeprefix("kafka."): v for k, v in options.items()})


@pytest.fixture
def job_topics(kafka: Settings) -> Iterator[tuple[str, str]]:
    job = f"w{uuid.uuid4().hex[:8]}"
    out = f"{job}.out"
    create_topic(kafka.kafka, out, partitions=2)
    create_topic(
        kafka.kafka, commits_topic(job), partitions=1, configs={"cleanup.policy": "compact"}
    )
    yield job, out


def test_each_partition_of_a_batch_is_written_once_and_a_zombie_is_fenced(
    kafka: Settings, spark: SparkSession, job_topics: tuple[str, str]
) -> None:
    job, out = job_topics
    engine = jvm_engine(spark)

    def batch(b: int) -> DataFrame:
        return spark.range(0, 90, numPartitions=3).select(
            F.lit(out).alias("topic"),
            F.col("id").cast("string").cast("binary").alias("key"),
            F.format_string(f"b{b}-%d", "id").cast("binary").alias("value"),
        )

    def write(frame: DataFrame, b: int) -> dict[str, int]:
        done = engine.KafkaOutput.write(
            frame._jdf, job, "o", b, b - 1, commits_topic(job), "{}", _config(kafka)
        )
        return dict(json.loads(done))

    assert write(batch(0), 0) == {"records": 90, "written": 90, "skipped": 0}
    # The same batch again (a re-run after a crash before the driver's marker): nothing.
    assert write(batch(0), 0) == {"records": 90, "written": 0, "skipped": 3}

    # Batch 1's first attempt commits two partitions of three, then dies.
    partial = batch(1).where(F.spark_partition_id() != 2)
    assert write(partial, 1) == {"records": 60, "written": 60, "skipped": 0}
    # A zombie of partition 2's writer holds a transaction open with a record in it.
    zombie = transactional_producer(
        kafka.kafka, str(engine.KafkaOutput.transactionalId(job, "o", 2))
    )
    zombie.begin_transaction()
    zombie.produce(out, value=b"zombie", key=b"z")
    zombie.flush(30)
    # The re-run writes the third partition only; its producer fences the zombie off.
    assert write(batch(1), 1) == {"records": 90, "written": 30, "skipped": 2}
    with pytest.raises(KafkaException):
        zombie.commit_transaction(30)

    values = _values(kafka, out)
    assert b"zombie" not in values
    expected = {f"b{b}-{i}".encode() for b in (0, 1) for i in range(90)}
    assert len(values) == 180 and set(values) == expected
    markers = [json.loads(v) for v in _values(kafka, commits_topic(job))]
    assert sorted((m["written_batch"], m["partition"], m["batch_id"]) for m in markers) == [
        (b, p, b - 1) for b in (0, 1) for p in range(3)
    ]


def test_fencing_an_output_aborts_what_every_partitions_writer_left_open(
    kafka: Settings, spark: SparkSession, job_topics: tuple[str, str]
) -> None:
    job, out = job_topics
    engine = jvm_engine(spark)
    # Zombies of the writers of partitions 0, 3 and 5, each with a record in a transaction.
    zombies = []
    for partition in (0, 3, 5):
        zombie = transactional_producer(
            kafka.kafka, str(engine.KafkaOutput.transactionalId(job, "o", partition))
        )
        zombie.begin_transaction()
        zombie.produce(out, value=f"zombie{partition}".encode(), key=b"z")
        zombie.flush(30)
        zombies.append(zombie)
    engine.KafkaOutput.fence(job, "o", 6, _config(kafka))
    for zombie in zombies:
        with pytest.raises(KafkaException):
            zombie.commit_transaction(30)
    # Nothing of theirs is visible, and the topic's end is not held by an open transaction.
    assert _values(kafka, out) == []


def test_a_partitions_producer_serves_its_next_batches_and_a_fenced_one_reads_the_markers(
    kafka: Settings, spark: SparkSession, job_topics: tuple[str, str]
) -> None:
    job, out = job_topics
    engine = jvm_engine(spark)
    config = _config(kafka)

    def batch(b: int) -> DataFrame:
        return spark.range(0, 60, numPartitions=3).select(
            F.lit(out).alias("topic"),
            F.col("id").cast("string").cast("binary").alias("key"),
            F.format_string(f"b{b}-%d", "id").cast("binary").alias("value"),
        )

    def write(frame: DataFrame, b: int) -> tuple[dict[str, int], int]:
        """What the write reports, and how many times its tasks read the markers."""
        reads = int(engine.KafkaOutput.markerReads())
        done = engine.KafkaOutput.write(
            frame._jdf, job, "o", b, b - 1, commits_topic(job), "{}", config
        )
        return dict(json.loads(done)), int(engine.KafkaOutput.markerReads()) - reads

    # The first batch opens a producer per partition, each reading the markers once.
    assert write(batch(0), 0) == ({"records": 60, "written": 60, "skipped": 0}, 3)
    # The next batches reuse them: no marker read, and a re-run is still skipped.
    assert write(batch(1), 1) == ({"records": 60, "written": 60, "skipped": 0}, 0)
    assert write(batch(1), 1) == ({"records": 60, "written": 0, "skipped": 3}, 0)

    # Another writer of partition 2 (another executor's attempt) commits batch 2 there with
    # its marker: it fences this JVM's producer, whose memory of the markers is stale now.
    other = transactional_producer(
        kafka.kafka, str(engine.KafkaOutput.transactionalId(job, "o", 2))
    )
    other.begin_transaction()
    for i in range(40, 60):
        other.produce(out, value=f"b2-{i}".encode(), key=str(i).encode())
    marker = {"output": "o", "partition": 2, "written_batch": 2, "batch_id": 1, "records": 20}
    key = str(engine.KafkaOutput.markerKey("o", 2)).encode()
    other.produce(commits_topic(job), value=json.dumps(marker).encode(), key=key)
    other.commit_transaction(30)
    # Batch 2: partition 2's producer finds itself fenced, a fresh one reads the markers and
    # skips the partition; the others write theirs without a read.
    assert write(batch(2), 2) == ({"records": 60, "written": 40, "skipped": 1}, 1)
    # A zombie fences partition 0's producer with a transaction left open: batch 3 is
    # written by a fresh producer, which aborts the zombie's.
    zombie = transactional_producer(
        kafka.kafka, str(engine.KafkaOutput.transactionalId(job, "o", 0))
    )
    zombie.begin_transaction()
    zombie.produce(out, value=b"zombie", key=b"z")
    zombie.flush(30)
    assert write(batch(3), 3) == ({"records": 60, "written": 60, "skipped": 0}, 1)
    with pytest.raises(KafkaException):
        zombie.commit_transaction(30)

    values = _values(kafka, out)
    expected = [f"b{b}-{i}".encode() for b in range(4) for i in range(60)]
    assert sorted(values) == sorted(expected)


# -- a large batch, written without reaching the driver -----------------------------------

#: Row counts the driver's Python process received, per call that moves rows to it.
_Received = list[tuple[str, int]]


def _instrumented(monkeypatch: pytest.MonkeyPatch) -> _Received:
    """Every DataFrame call that brings rows to the driver's Python process, with how
    many rows it brought."""
    received: _Received = []
    for name in ("collect", "toArrow", "toPandas", "take", "head", "tail", "toLocalIterator"):
        # The class sessions make (pyspark.sql.DataFrame is its abstract face).
        original: Callable[..., Any] = getattr(ClassicDataFrame, name)

        def counted(self: DataFrame, *args: Any, _f: Any = original, _n: str = name) -> Any:
            result = _f(self, *args)
            if _n == "toLocalIterator":
                result = list(result)
            size = result.num_rows if isinstance(result, pa.Table) else len(result)
            received.append((_n, size))
            return result

        monkeypatch.setattr(ClassicDataFrame, name, counted)
    return received


def test_a_large_batch_is_written_by_the_tasks_and_never_reaches_the_driver(
    kafka: Settings,
    spark: SparkSession,
    job_topics: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job, out = job_topics
    n = 250_000
    padding = "x" * 400
    rows = spark.range(0, n, numPartitions=4).select(
        F.lit("record").alias("kind"),
        F.to_json(
            F.struct(
                F.col("id").alias("user"),
                F.lit(padding).alias("pad"),
            )
        ).alias("row"),
        F.col("id").cast("int").alias("src_partition"),
        F.col("id").alias("src_offset"),
    )
    source = _clicks()
    target = OutputTarget(
        job=job,
        name="o",
        source=source,
        keys=(),
        topics=(out,),
        redis=False,
        lakes=(),
        checkpoint="unused",
        records_are_events=True,
    )
    publisher = KafkaPublisher(kafka, job)
    writer = OutputWriter(target, publisher, None, reader=None)
    received = _instrumented(monkeypatch)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, the peak so far
    writer(_shaped(rows), 0)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    monkeypatch.undo()

    # The driver received counts only: a few rows per call, never the batch's.
    assert received and max(size for _, size in received) < 100, received
    # The batch is over 100 MB of records; the driver's peak memory barely moved.
    assert grown_mib < 40, f"the driver's peak memory grew by {grown_mib:.0f} MiB"
    marker = publisher.committed("o")
    assert marker is not None and marker["batch"]["kafka_records"] == n
    assert marker["totals"]["events"] == n
    # Every record is in the topic once (counted by Spark, read_committed).
    read = (
        spark.read.format("kafka")
        .options(**kafka.kafka.spark_kafka_options())
        .option("subscribe", out)
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    counted = read.agg(F.count("*").alias("n"), F.count_distinct("value").alias("d")).first()
    assert counted is not None and (counted["n"], counted["d"]) == (n, n)


# -- the serving store, written by the tasks ----------------------------------------------


def test_the_tasks_store_the_windows_the_driver_stored(
    serving: Settings, spark: SparkSession
) -> None:
    from kappaflow.serving.client import redis_client
    from kappaflow.streams.output.backends import BatchAccount, RedisStore
    from kappaflow.streams.output.task_records import store_windows

    table, frame = _changes(
        spark,
        ['["a"]', '["a"]', '["b"]', '["c"]', '["caf\u00e9 \\"x\\""]'],
        kind=["provisional", "final", "correction", "correction", "provisional"],
        values=['{"n":1}', '{"n":2}', '{"n":3}', None, '{"n":5}'],
        version=[1, 2, 3, 4, 1],
        watermark=[START, START + MINUTE, START + MINUTE, START, START],
    )
    client = redis_client(serving)
    by_driver, by_tasks = (RedisStore(client, f"j{uuid.uuid4().hex[:8]}") for _ in range(2))
    # The window c held before is removed by its retraction, by both.
    for store in (by_driver, by_tasks):
        client.hset(f'kf:{store.job}:o:w:["c"]', str(START), "{}")
    account = BatchAccount({"events": 5}, START, {START: 4})
    by_driver.apply(
        "o", 0, table.sort_by([("key", "ascending"), ("version", "ascending")]), account
    )
    # The changes spread over three partitions, a window's versions in one.
    spread = frame.repartition(3, "key")
    assert by_tasks.write("o", store_windows(spread)) == 5
    by_tasks.account("o", 0, account)

    def held(job: str) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for name in client.keys(f"kf:{job}:o:*"):
            kind = client.type(name)
            text = name.decode() if isinstance(name, bytes) else name
            short = text.removeprefix(f"kf:{job}:o:")
            if kind == b"hash":
                found[short] = client.hgetall(name)
            elif kind == b"set":
                found[short] = client.smembers(name)
        return found

    stored = held(by_tasks.job)
    assert stored == held(by_driver.job)
    assert json.loads(stored['w:["a"]'][str(START).encode()]) == {
        "end": START + MINUTE,
        "values": {"n": 2},
        "version": 2,
        "final": True,
    }
    assert 'w:["c"]' not in stored and stored["keys"] == {
        b'["a"]',
        b'["b"]',
        '["caf\u00e9 \\"x\\""]'.encode(),
    }


class _CountingStore(MemoryStore):
    """The in-memory store, counting the Spark jobs its ``write`` runs."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, output: str, rows: DataFrame) -> int:
        self.writes += 1
        return super().write(output, rows)


def _clicks() -> Source:
    """The source of the outputs the tests write: clicks keyed by user."""
    return Source(
        topic="clicks",
        schema=RecordSchema("Click", (), None),
        keys=("user",),
        time="at",
        id=None,
        watermark_ms=0,
        lateness_ms=0,
        start="earliest",
    )


def _batch(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    columns = "kind string, key string, window_start bigint, window_end bigint, values string"
    more = ", version bigint, watermark bigint, events bigint, held bigint"
    return _shaped(spark.createDataFrame(rows, columns + more))


def test_a_batch_without_changes_runs_no_store_write_and_is_accounted(
    spark: SparkSession,
) -> None:
    source = _clicks()
    target = OutputTarget(
        job="j",
        name="o",
        source=source,
        keys=("user",),
        topics=(),
        redis=True,
        lakes=(),
        checkpoint="unused",
        aggregated=True,
    )
    store = _CountingStore()
    writer = OutputWriter(target, MemoryPublisher(), store, reader=None)
    blank = dict.fromkeys(("key", "values", "version", "events", "held"))
    stats = {**blank, "kind": "stats", "window_start": START, "window_end": START + MINUTE}
    # Batch 0: a statistics row only (events counted, the watermark moved, no change).
    only_stats = [{**stats, "events": 3, "held": 1, "watermark": START + 5}]
    writer(_batch(spark, only_stats), 0)
    assert store.writes == 0
    assert store.stats["o"] == {
        "events": 3,
        "duplicates": 0,
        "late": 0,
        "dead_letters": 0,
        "watermark": START + 5,
    }
    assert store.open["o"] == {START: 1} and store.applied["o"] == 0
    # Batch 1: a change besides its statistics is written.
    change = {
        **blank,
        "kind": "provisional",
        "key": '["a"]',
        "window_start": START,
        "window_end": START + MINUTE,
        "values": '{"n":4}',
        "version": 1,
        "watermark": START + 6,
    }
    with_change = [{**stats, "events": 1, "held": 0, "watermark": START + 6}, change]
    writer(_batch(spark, with_change), 1)
    assert store.writes == 1
    assert store.windows["o"][('["a"]', START)]["values"] == {"n": 4}
    assert store.stats["o"]["events"] == 4 and store.applied["o"] == 1

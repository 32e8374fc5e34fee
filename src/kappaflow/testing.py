"""Testing a job without a broker or Redis: its ``build`` on local Spark, over batches
the test gives.

``run(build, {"orders": [batch0, batch1, ...]})`` feeds each source its batches, one
micro-batch each and in order, so the watermark moves exactly as the test says: it
trails the largest event time of the batches before. The job runs as it would for
real, the same queries and the same batch writer, with Kafka, Redis and the lake
replaced by twins that keep what they were given (the lake is real Parquet, in a
temporary directory). The result holds every output record, dead letter and late event.

A record in a batch is a ``dict`` (sent as JSON), a ``str`` or ``bytes`` (sent as they
are: malformed input for dead-letter tests), or a :class:`Record` with a key, a
partition and a Kafka timestamp (by default, when the harness writes the batch).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kappaflow.errors import HarnessError
from kappaflow.streams.output.backends import MemoryPublisher, MemoryStore
from kappaflow.streams.output.lake_read import read_arrow
from kappaflow.streams.runtime import Backends, Build, declare, start_outputs
from kappaflow.timeutil import from_epoch_ms, iso

#: The columns of Spark's Kafka source, which the harness's files imitate.
KAFKA_SCHEMA = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
)
_ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


@dataclass(frozen=True)
class Record:
    """A source record with its Kafka key, partition and timestamp."""

    value: Any
    key: str | bytes | None = None
    partition: int = 0
    #: When the record was written to Kafka (``kf.logged_at()``; timezone-aware), for
    #: rules that judge by it; None: when the harness writes the batch.
    timestamp: datetime | None = None


@dataclass
class Results:
    """Everything a job's run under the harness wrote."""

    job: str
    publisher: MemoryPublisher
    store: MemoryStore
    lake_root: Path
    #: Each query's progress reports, as Spark gives them (``query.recentProgress``), by
    #: query name (``JOB.OUTPUT``).
    progress: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def records(self, topic: str) -> list[dict[str, Any]]:
        """The JSON records published to ``topic`` (committed, in order)."""
        return [json.loads(value) for _, value in self.publisher.topics.get(topic, [])]

    def keys(self, topic: str) -> list[Any]:
        """The keys of the records published to ``topic``, as JSON (None: no key)."""
        return [json.loads(key) if key else None for key, _ in self.publisher.topics.get(topic, [])]

    def latest(self, output: str) -> dict[tuple[Any, ...], dict[str, Any]]:
        """What the serving store holds for a keyed stream ``output``: key values → the
        key's latest record."""
        return {tuple(json.loads(k)): v for k, v in self.store.latest.get(output, {}).items()}

    def changes(self, output: str) -> list[dict[str, Any]]:
        """Every change of a windowed output's results, from its changelog topic."""
        return self.records(f"{self.job}.{output}")

    def current(self, output: str) -> dict[tuple[Any, ...], dict[str, Any]]:
        """What the serving store holds for ``output``: (key values..., window start ISO)
        → the window's ``values``, ``final`` and ``version``."""
        found = {}
        for (key, start), window in self.store.windows.get(output, {}).items():
            found[(*json.loads(key), iso(from_epoch_ms(start)))] = window
        return found

    @property
    def dead_letters(self) -> list[dict[str, Any]]:
        """The job's dead letters, each with ``value`` (the original bytes) decoded."""
        letters = self.records(f"{self.job}.dlq")
        for letter in letters:
            raw = letter.get("value_base64")
            letter["value"] = base64.b64decode(raw) if raw else None
        return letters

    @property
    def late(self) -> list[dict[str, Any]]:
        """The events too late for their window, or behind a stream join's watermark."""
        return self.records(f"{self.job}.late")

    def stats(self, output: str) -> dict[str, int]:
        """The output's accounting (events passed, duplicates, late, dead letters, Kafka
        records and lake rows written) as its last commit marker holds it."""
        marker = self.publisher.markers.get(output)
        return dict(marker["totals"]) if marker else {}

    def lake(self, table: str) -> list[dict[str, Any]]:
        """The committed rows of the lake table ``table`` (a name the job gave)."""
        rows: list[dict[str, Any]] = read_arrow(str(self.lake_root / self.job / table)).to_pylist()
        return rows


class BatchFiles:
    """The harness's sources: each batch of a topic is one Parquet file, read one file per
    micro-batch, oldest first."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, topic: str, batches: Sequence[Sequence[Any]]) -> None:
        folder = self.root / topic
        folder.mkdir(parents=True, exist_ok=True)
        next_offset: dict[int, int] = {}
        # The file source orders files by modification time: make it the batch order.
        base = 1_600_000_000
        for index, batch in enumerate(batches):
            rows = []
            written = datetime.now(UTC)
            for item in batch:
                record = item if isinstance(item, Record) else Record(item)
                if record.timestamp is not None and record.timestamp.tzinfo is None:
                    raise HarnessError(f"{topic}: a Record's timestamp needs a zone (UTC)")
                offset = next_offset.get(record.partition, 0)
                next_offset[record.partition] = offset + 1
                rows.append(
                    {
                        "key": _bytes(record.key),
                        "value": _bytes(record.value),
                        "topic": topic,
                        "partition": record.partition,
                        "offset": offset,
                        "timestamp": record.timestamp or written,
                    }
                )
            path = folder / f"batch-{index:05d}.parquet"
            pq.write_table(pa.Table.from_pylist(rows, schema=_ARROW_SCHEMA), path)
            os.utime(path, (base + index, base + index))

    def stream(self, spark: SparkSession, topic: str, start: str) -> DataFrame:
        if not (self.root / topic).is_dir():
            raise HarnessError(f"the job reads {topic!r}, but the test gave it no batches")
        return (
            spark.readStream.schema(KAFKA_SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(self.root / topic))
        )

    def table(self, spark: SparkSession, topic: str) -> DataFrame:
        """A reference table's topic: every batch at once, as the table the stream sees
        in each of its micro-batches (the last record per key wins)."""
        if not (self.root / topic).is_dir():
            raise HarnessError(f"the job reads table {topic!r}, but the test gave it no batches")
        return spark.read.schema(KAFKA_SCHEMA).parquet(str(self.root / topic))

    def read_range(
        self, spark: SparkSession, topic: str, ranges: dict[int, tuple[int, int]]
    ) -> DataFrame:
        wanted = F.lit(False)
        for partition, (low, high) in ranges.items():
            wanted = wanted | (
                (F.col("partition") == partition) & F.col("offset").between(low, high)
            )
        return spark.read.schema(KAFKA_SCHEMA).parquet(str(self.root / topic)).where(wanted)


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value).encode()


@dataclass
class Harness:
    """Runs jobs on one Spark session; each run in a directory of its own."""

    spark: SparkSession
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kappaflow-test-")))
    runs: int = 0

    def run(
        self,
        build: Build,
        inputs: Mapping[str, Sequence[Any]],
        *,
        params: Mapping[str, str] | None = None,
        name: str = "job",
        timeout_s: float = 300.0,
    ) -> Results:
        self.runs += 1
        home = self.root / f"run-{self.runs}"
        files = BatchFiles(home / "sources")
        for topic, batches in inputs.items():
            files.write(topic, batches)
        job = declare(build, name, params or {}, self.spark, files)
        publisher, store = MemoryPublisher(), MemoryStore()
        backends = Backends(
            publisher=publisher,
            store=store,
            checkpoint_root=str(home / "checkpoints"),
            lake_root=str(home / "lake"),
        )
        queries = start_outputs(job, files, backends, available_now=True)
        progress: dict[str, list[dict[str, Any]]] = {}
        try:
            for query in queries:
                if not query.awaitTermination(int(timeout_s)):
                    raise HarnessError(f"query {query.name} did not finish in {timeout_s:.0f} s")
                error = query.exception()
                if error is not None:
                    raise HarnessError(f"query {query.name} failed: {error}".splitlines()[0])
                progress[query.name] = [json.loads(p.json) for p in query.recentProgress]
        finally:
            for query in queries:
                query.stop()
        return Results(name, publisher, store, home / "lake", progress)


_default: Harness | None = None


def run(
    build: Build,
    inputs: Mapping[str, Sequence[Any]],
    *,
    params: Mapping[str, str] | None = None,
    spark: SparkSession | None = None,
    name: str = "job",
) -> Results:
    """Run ``build`` over ``inputs`` (topic → batches of records) and return what it wrote.

    Without ``spark``, the harness makes one local session and keeps it for every run.
    """
    global _default
    if spark is not None:
        return Harness(spark).run(build, inputs, params=params, name=name)
    if _default is None:
        _default = Harness(local_session())
    return _default.run(build, inputs, params=params, name=name)


def local_session() -> SparkSession:
    """A small local Spark session for tests: two cores, few shuffle partitions, this
    interpreter in the Python workers, every server on loopback."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return (
        SparkSession.builder.master("local[2]")
        .appName("kappaflow-test")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .getOrCreate()
    )

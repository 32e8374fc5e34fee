"""The job API's vocabulary: the columns kappaflow keeps beside a stream's own, a declared
source, the windows and joins it goes through, and where sources are read from."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from kappaflow.errors import InvalidWindowError
from kappaflow.streams.schema import RecordSchema
from kappaflow.timeutil import parse_duration

#: The columns kappaflow keeps beside a stream's own.
TIME, PARTITION, OFFSET = "_kf_time", "_kf_partition", "_kf_offset"


BOOKKEEPING = (TIME, PARTITION, OFFSET)


#: The record's Kafka timestamp, which ``logged_at`` names.
LOGGED = "_kf_logged"


#: The parser's verdict and the record as Kafka held it, beside the bookkeeping columns
#: until the stream is output (``Stream.df`` leaves them out).
_VERDICT = ("_kf_reason", "_kf_value", "_kf_topic", LOGGED)

#: On a source's parsed records only: which of the job's dead letters a replayed record
#: is (``PARTITION:OFFSET`` in ``JOB.dlq``; null for the others). See parsing.py.
REPLAY_COLUMN = "_kf_replay"


def logged_at() -> Column:
    """The time each record was written to Kafka, as a timestamp column: its Kafka
    timestamp, the producer's create time (or the broker's append time, on a topic with
    ``message.timestamp.type=LogAppendTime``), kept in the log with the record.

    For rules on a source's records that must judge a replay as they judged the live run,
    which the clock (``current_timestamp()``) does not: ``readings.reject(F.col("time") >
    kf.logged_at() + F.expr("INTERVAL 1 DAY"), "from the future")``. It names a column of
    a source's stream and of the streams made from it by ``where``, ``select``,
    ``with_column``, ``reject`` and ``join`` (the left stream's record); a processed or
    aggregated stream's records are new, and have none.
    """
    return F.col(LOGGED)


class Reader(Protocol):
    """Where a job's sources come from: Kafka (app.py), or the test harness's batches
    (kappaflow.testing). Every DataFrame has Kafka's columns."""

    def stream(self, spark: SparkSession, topic: str, start: str) -> DataFrame:
        """The topic as an unbounded DataFrame."""
        ...

    def read_range(
        self, spark: SparkSession, topic: str, ranges: dict[int, tuple[int, int]]
    ) -> DataFrame:
        """The records at these offsets (partition → first and last offset)."""
        ...

    def table(self, spark: SparkSession, topic: str) -> DataFrame:
        """Every record of the topic, as a bounded DataFrame a streaming query plans
        again in each micro-batch (a reference table's contents)."""
        ...


@dataclass(frozen=True)
class Source:
    """A declared source: its topic, record type and event-time settings."""

    topic: str
    schema: RecordSchema
    keys: tuple[str, ...]
    time: str
    id: str | None
    watermark_ms: int
    lateness_ms: int
    start: str
    #: The record type's class, which stateful functions get their events as.
    model: type | None = None
    #: The joins a stream from this source went through (joins.py), in order.
    joins: tuple[Joined, ...] = ()
    #: The records ``Stream.reject`` refused, each frame with its ``_kf_reason`` set: the
    #: runtime sends them to the dead-letter topic.
    rejected: tuple[DataFrame, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class WindowSpec:
    """Event-time windows: ``size_ms`` long, starting every ``slide_ms`` (tumbling: None);
    with ``session``, per key, events closer than ``size_ms`` (the gap) form one window."""

    size_ms: int
    slide_ms: int | None
    session: bool = False


def millis(value: str | int | timedelta, what: str) -> int:
    """A duration argument (``"10s"``, a timedelta or milliseconds) in milliseconds."""
    if isinstance(value, timedelta):
        found = value
    elif isinstance(value, int):
        found = timedelta(milliseconds=value)
    else:
        found = parse_duration(value)
    ms = int(found / timedelta(milliseconds=1))
    if ms < 0:
        raise InvalidWindowError(f"{what} must not be negative")
    return ms


def refusal(condition: Column | str, reason: str | Column) -> tuple[Column, Column]:
    """A ``reject`` rule as columns: whether a record is refused (a null condition is
    not), and the reason it is given."""
    rule = F.expr(condition) if isinstance(condition, str) else condition
    why = F.lit(reason) if isinstance(reason, str) else reason
    return F.coalesce(rule, F.lit(False)), F.coalesce(why, F.lit("refused by a rule of the job"))


@dataclass(frozen=True)
class Joined:
    """A join a stream went through: what with, on which columns, how."""

    kind: str  # "table" or "stream"
    name: str  # the table's topic or path, or the other stream's topic
    on: tuple[str, ...]
    how: str
    within_ms: int | None = None
    #: The joined topic's source and its records with their verdicts, whose dead letters
    #: the runtime sends to the dead-letter topic (None: a Parquet table).
    carries: tuple[Source, DataFrame] | None = field(default=None, compare=False, repr=False)
    #: A stream join's inputs as they enter it, one row per event (``behind`` rows:
    #: topic, partition, offset, event time, key): the output's writer picks those behind
    #: the join's watermark, which Spark's join drops, and sends them to the late topic.
    taps: tuple[DataFrame, ...] = field(default=(), compare=False, repr=False)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "with": self.name,
            "on": list(self.on),
            "how": self.how,
            "within_ms": self.within_ms,
        }


@dataclass(frozen=True)
class Side:
    """What a join or a stateful function takes of a stream: its rows (the records that
    parsed, with kappaflow's columns and their verdict), its source, every record of the
    source as it parsed, and whether a stateful function already processed it."""

    frame: DataFrame
    source: Source
    parsed: DataFrame
    processed: bool = False

    @property
    def df(self) -> DataFrame:
        """The rows without the parser's verdict columns (``Stream.df``)."""
        return self.frame.drop(*_VERDICT)

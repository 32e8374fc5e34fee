"""Where a job's results go: the sinks a user names in ``.to(...)``: ``topic()`` (Kafka),
``store()`` (the Redis serving store), ``lake()`` (a Parquet table) and ``postgres()`` (a
PostgreSQL table).

These are declarations only; the batch writer (writer.py) carries them out, all sinks of
one output in one ``foreachBatch``, so that each holds every result exactly once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kappaflow.errors import InvalidSinkError
from kappaflow.streams.formats import AvroFormat, ProtobufFormat, RegistryFormat

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_LAKE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_SQL_NAME = r"[a-z_][a-z0-9_]{0,62}"
_TABLE = re.compile(rf"^(?:{_SQL_NAME}\.)?{_SQL_NAME}$")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class KafkaSink:
    """Records in a Kafka topic, published in one transaction per batch.

    ``topic`` None means the output's own topic, ``JOB.OUTPUT``. A windowed aggregate's
    records there are its changelog: every change of a window's values, with the values
    before it; a stream's records are its rows as JSON objects. ``compact``: the topic is
    created compacted, keeping at least the latest record of each key. ``format``: a
    stream's rows as Avro in the schema registry's wire format, under its subject.
    """

    topic: str | None = None
    compact: bool = False
    format: RegistryFormat | None = None


@dataclass(frozen=True)
class RedisSink:
    """The serving store: the current values of every window of every key."""


@dataclass(frozen=True)
class ParquetSink:
    """A table in the Parquet lake.

    ``table`` is a name (the table ``<lake>/JOB/NAME``) or a Hadoop-compatible URI or
    absolute path. Rows are partitioned by the columns ``partition_by`` and, with
    ``by_date``, by the UTC date of that timestamp column.
    """

    table: str
    partition_by: tuple[str, ...] = ()
    by_date: str | None = None


@dataclass(frozen=True)
class PostgresSink:
    """A PostgreSQL table, upserted by its key: each key's current row.

    ``table`` is ``name`` or ``schema.name``; ``key`` the columns a row is found by (a
    windowed aggregate's: its ``by`` columns and ``window_start``, always); ``dsn`` None
    means the settings' server (the embedded one unless ``postgres.dsn`` is set).
    """

    table: str
    key: tuple[str, ...] = ()
    dsn: str | None = None


Sink = KafkaSink | RedisSink | ParquetSink | PostgresSink


def topic(
    name: str | None = None,
    *,
    compact: bool = False,
    format: RegistryFormat | None = None,
) -> KafkaSink:
    """Publish to the Kafka topic ``name`` (default: the output's own, ``JOB.OUTPUT``);
    ``compact=True`` creates it compacted (the latest record per key is kept), for an
    output read as a table (``job.table``). A topic that exists is left as it is.

    ``format=kf.avro(subject)``: a stream's rows as Avro records, their schema (the
    stream's row type) registered under ``subject`` when the job starts; a change the
    subject's compatibility level refuses stops the start (KF755, naming the field).
    """
    if name is not None and not _TOPIC.match(name):
        raise InvalidSinkError(f"topic sink: {name!r} is not a valid topic name")
    if format is not None and not isinstance(format, AvroFormat | ProtobufFormat):
        raise InvalidSinkError("topic sink: format= is kf.avro(subject) or kf.protobuf(subject)")
    return KafkaSink(name, compact, format)


def store() -> RedisSink:
    """Keep the current results in the serving store (windowed aggregates only)."""
    return RedisSink()


def lake(
    table: str, *, partition_by: str | Sequence[str] = (), by_date: str | None = None
) -> ParquetSink:
    """Append to the lake table ``table`` (a name, an absolute path or a URI)."""
    if not (_LAKE_NAME.match(table) or table.startswith("/") or "://" in table):
        raise InvalidSinkError(
            f"lake sink: {table!r} is neither a table name, an absolute path nor a URI"
        )
    columns = (partition_by,) if isinstance(partition_by, str) else tuple(partition_by)
    return ParquetSink(table, columns, by_date)


def postgres(table: str, *, key: str | Sequence[str] = (), dsn: str | None = None) -> PostgresSink:
    """Upsert into the PostgreSQL table ``table`` (created if missing), by ``key``: a
    stream's rows by those columns (default: the stream's key), a windowed aggregate's
    windows by their key and start, corrections updating the row in place. Each batch's
    partition is written in one transaction with its marker: exactly once. ``dsn``: a
    ``postgresql://`` URI of another server than the settings'."""
    if not _TABLE.match(table):
        raise InvalidSinkError(
            f"postgres sink: {table!r} is not a table name (lower case letters, digits and "
            "_, optionally after a schema and a dot)"
        )
    columns = (key,) if isinstance(key, str) else tuple(key)
    for column in columns:
        if not _COLUMN.match(column):
            raise InvalidSinkError(f"postgres sink: key column {column!r} is not a column name")
    if dsn is not None and not dsn.startswith(("postgresql://", "postgres://")):
        raise InvalidSinkError("postgres sink: dsn= is a postgresql:// URI")
    return PostgresSink(table, columns, dsn)

"""An output's PostgreSQL tables: each key's current row, upserted from the tasks.

The table is created on the first batch if it does not exist, with a column per field
(the type mapping: ``sql_type``) and the key as its primary key. The tasks write: each
its partition of a batch in one transaction with a marker row in ``kappaflow_markers``
(PostgresOutput.java), so a batch run again after a crash writes nothing twice. The
marker names the output's query (the id its checkpoint keeps): a job removed and started
anew begins with batch 0 again, under a new id.

A windowed aggregate's row is its window: the key columns, ``window_start`` and
``window_end``, a column per aggregate value, the ``kind`` of the last change
(provisional, final, correction), its ``version`` and whether it is ``final``; a
correction updates the row in place, and a session merged into another (a change without
values) deletes its row. A stream's row is its record, upserted by the key columns.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.conninfo import conninfo_to_dict
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from kappaflow.errors import InvalidSinkError
from kappaflow.postgresql.server import connect
from kappaflow.streams.jvm import jvm_engine
from kappaflow.streams.kinds import CHANGES, RECORD
from kappaflow.streams.output.lake_fs import HadoopFs

#: One row per (output's query, batch, partition) written: the tasks' markers.
MARKERS_DDL = """
CREATE TABLE IF NOT EXISTS kappaflow_markers (
    job text NOT NULL,
    output text NOT NULL,
    batch bigint NOT NULL,
    partition integer NOT NULL,
    rows bigint NOT NULL,
    written_at timestamptz NOT NULL,
    PRIMARY KEY (job, output, batch, partition)
)
"""
#: The columns a windowed aggregate's table has besides its key and values.
WINDOW_COLUMNS = ("window_start", "window_end")
CHANGE_COLUMNS = (("kind", "text"), ("version", "bigint"), ("final", "boolean"))


def sql_type(kind: DataType) -> str:
    """The PostgreSQL type of a column of Spark type ``kind``."""
    simple: list[tuple[type[DataType], str]] = [
        (StringType, "text"),
        (LongType, "bigint"),
        (IntegerType, "integer"),
        (ShortType, "smallint"),
        (ByteType, "smallint"),
        (DoubleType, "double precision"),
        (FloatType, "real"),
        (BooleanType, "boolean"),
        (TimestampType, "timestamptz"),
        (TimestampNTZType, "timestamp"),
        (DateType, "date"),
        (BinaryType, "bytea"),
    ]
    for spark_type, name in simple:
        if isinstance(kind, spark_type):
            return name
    if isinstance(kind, DecimalType):
        return f"numeric({kind.precision},{kind.scale})"
    if isinstance(kind, ArrayType | MapType | StructType):
        return "jsonb"
    return "text"


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quoted_table(table: str) -> str:
    return ".".join(quoted(part) for part in table.split("."))


@dataclass(frozen=True)
class PgColumn:
    name: str
    sql_type: str
    #: How the column is computed from the batch's rows.
    spark: DataType


@dataclass(frozen=True)
class PostgresTable:
    """One ``kf.postgres()`` sink of an output, its columns resolved."""

    table: str
    dsn: str
    columns: tuple[PgColumn, ...]
    key: tuple[str, ...]
    #: Whether the output is a windowed aggregate (its rows are changes).
    aggregated: bool

    def ddl(self) -> str:
        lines = [f"    {quoted(c.name)} {c.sql_type}" for c in self.columns]
        lines.append(f"    PRIMARY KEY ({', '.join(quoted(k) for k in self.key)})")
        body = ",\n".join(lines)
        return f"CREATE TABLE IF NOT EXISTS {quoted_table(self.table)} (\n{body}\n)"

    def spec(self) -> dict[str, Any]:
        """What PostgresOutput.java needs: the JDBC URL and properties, the table, its
        columns and placeholders, and the key's indexes."""
        url, properties = jdbc(self.dsn)
        names = [c.name for c in self.columns]
        return {
            "url": url,
            "properties": properties,
            "table": quoted_table(self.table),
            "columns": [quoted(n) for n in names],
            "placeholders": [
                "CAST(? AS jsonb)" if c.sql_type == "jsonb" else "?" for c in self.columns
            ],
            "key": [names.index(k) for k in self.key],
        }


def jdbc(dsn: str) -> tuple[str, dict[str, str]]:
    """The JDBC URL and connection properties of a libpq DSN."""
    given = conninfo_to_dict(dsn)
    host = str(given.pop("host", "localhost"))
    port = str(given.pop("port", "5432"))
    database = str(given.pop("dbname", ""))
    properties = {"ApplicationName": "kappaflow"}
    names = {"user": "user", "password": "password", "sslmode": "sslmode"}
    for option, value in given.items():
        if option in names and value is not None:
            properties[names[option]] = str(value)
    return f"jdbc:postgresql://{host}:{port}/{database}", properties


def aggregate_table(
    table: str,
    dsn: str,
    keys: Sequence[tuple[str, DataType]],
    values: Sequence[tuple[str, DataType]],
    key: Sequence[str] = (),
) -> PostgresTable:
    """A windowed aggregate's table: keyed by its key columns and the window's start."""
    wanted = (*[k for k, _ in keys], "window_start")
    if key and tuple(key) != wanted:
        raise InvalidSinkError(
            f"postgres sink {table!r}: a windowed aggregate's rows are keyed by "
            f"{', '.join(wanted)}; leave key= out"
        )
    columns = [PgColumn(name, sql_type(kind), kind) for name, kind in keys]
    columns += [PgColumn(name, "timestamptz", TimestampType()) for name in WINDOW_COLUMNS]
    columns += [PgColumn(name, sql_type(kind), kind) for name, kind in values]
    kinds = {"text": StringType(), "bigint": LongType(), "boolean": BooleanType()}
    columns += [PgColumn(name, kind, kinds[kind]) for name, kind in CHANGE_COLUMNS]
    _unique(table, columns)
    return PostgresTable(table, dsn, tuple(columns), wanted, True)


def stream_table(table: str, dsn: str, schema: StructType, key: Sequence[str]) -> PostgresTable:
    """A stream's table: a column per field of its rows, keyed by ``key``."""
    if not key:
        raise InvalidSinkError(
            f"postgres sink {table!r}: name the key its rows are upserted by (key=...)"
        )
    missing = [k for k in key if k not in schema.names]
    if missing:
        raise InvalidSinkError(
            f"postgres sink {table!r}: no column {missing[0]!r} to key by "
            f"(columns: {', '.join(schema.names)})"
        )
    columns = [PgColumn(f.name, sql_type(f.dataType), f.dataType) for f in schema.fields]
    return PostgresTable(table, dsn, tuple(columns), tuple(key), False)


def _unique(table: str, columns: Sequence[PgColumn]) -> None:
    names = [c.name for c in columns]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidSinkError(f"postgres sink {table!r}: two columns named {twice[0]!r}")


def table_rows(target: PostgresTable, rows: DataFrame, row_schema: StructType | None) -> DataFrame:
    """The batch's rows for ``target`` (PostgresOutput.java's): ``_op`` then its columns;
    a window's changes in order of version within its partition."""
    if target.aggregated:
        changes = rows.where(F.col("kind").isin(*CHANGES)).sortWithinPartitions(
            "key", "window_start", "version"
        )
        return changes.select(
            F.when(F.col("values").isNull(), "d").otherwise("u").alias("_op"),
            *_window_columns(target, changes),
        )
    assert row_schema is not None
    records = rows.where(F.col("kind") == RECORD).select(F.from_json("row", row_schema).alias("r"))
    return records.select(
        F.lit("u").alias("_op"),
        *[_cell(F.col("r").getField(c.name), c).alias(c.name) for c in target.columns],
    )


def _cell(column: Column, spec: PgColumn) -> Column:
    return F.to_json(column) if spec.sql_type == "jsonb" else column


def _window_columns(target: PostgresTable, changes: DataFrame) -> list[Column]:
    key = F.parse_json(F.col("key"))
    n_keys = len(target.key) - 1
    kind, end = F.col("kind"), F.col("window_end")
    final = (kind == "final") | ((kind == "correction") & (end <= F.col("watermark")))
    out: list[Column] = []
    for i, c in enumerate(target.columns):
        if i < n_keys:
            value = F.variant_get(key, f"$[{i}]", c.spark.simpleString())
        elif c.name in WINDOW_COLUMNS:
            value = F.timestamp_millis(c.name)
        elif c.name == "kind":
            value = kind
        elif c.name == "version":
            value = F.col("version")
        elif c.name == "final":
            value = final
        elif c.sql_type == "jsonb":
            value = F.get_json_object("values", f"$.{c.name}")
        else:
            value = F.get_json_object("values", f"$.{c.name}").cast(c.spark)
        out.append(value.alias(c.name))
    return out


class PostgresWriter:
    """Writes an output's batches to one table (created on the first batch)."""

    def __init__(self, target: PostgresTable) -> None:
        self.target = target
        self._ready = False
        self._query: str | None = None

    def prepare(self) -> None:
        """The marker table and the output's table, created if missing."""
        with connect(self.target.dsn) as conn:
            conn.execute(MARKERS_DDL)
            conn.execute(self.target.ddl())
        self._ready = True

    def write(
        self,
        job: str,
        output: str,
        batch_id: int,
        rows: DataFrame,
        row_schema: StructType | None,
        checkpoint: str,
    ) -> int:
        """The batch's rows for the table, each partition once; how many rows the batch
        has (those written before included)."""
        if not self._ready:
            self.prepare()
        if self._query is None:
            self._query = query_id(rows, checkpoint)
        frame = table_rows(self.target, rows, row_schema)
        engine = jvm_engine(rows.sparkSession)
        marked = f"{output}@{self._query}"
        done = json.loads(
            engine.PostgresOutput.write(
                frame._jdf, job, marked, batch_id, json.dumps(self.target.spec())
            )
        )
        return int(done["rows"])


def query_id(rows: DataFrame, checkpoint: str) -> str:
    """The id of the output's query, from its checkpoint's metadata (the same through
    restarts; new for a new checkpoint)."""
    metadata = HadoopFs(rows.sparkSession, checkpoint).read_text("metadata")
    return str(json.loads(metadata.splitlines()[0])["id"])


def value_types(aggregates: Any, column_types: dict[str, DataType]) -> list[tuple[str, DataType]]:
    """Each aggregate value's Spark type: counts as bigint, a mean as double, a sum, min
    or max as the column's kind of number, quantiles as JSON."""
    out: list[tuple[str, DataType]] = []
    for name, agg in aggregates.items():
        kind = agg.kind
        if kind in ("count", "approx_distinct"):
            out.append((name, LongType()))
        elif kind in ("sum", "min", "max"):
            column = column_types.get(agg.column)
            integral = isinstance(column, LongType | IntegerType | ShortType | ByteType)
            out.append((name, LongType() if integral else DoubleType()))
        elif kind == "mean":
            out.append((name, DoubleType()))
        else:
            out.append((name, MapType(StringType(), DoubleType())))
    return out

"""The Parquet lake sink: each micro-batch's rows land in a table exactly once.

Spark re-runs the last batch after a crash with the same id and the same rows, and a
driver can die anywhere inside ``write``. So a batch is written in three moves, and only
the last makes it visible:

1. Spark's writer writes the rows into a staging directory of this attempt alone
   (``_staging/batch=<id>-<attempt>``), with the table's partition directories;
2. the files move into the table's partition directories under names that carry the batch
   id and the attempt, after a *publishing record* lists where they go;
3. the batch's manifest (``_kappaflow/manifest/<id>.json``: files, row counts, schema) is
   written to a temporary file and renamed into place: the commit point.

The readers (``lake_read``) read only the files manifests list, so moved files without a
manifest are invisible. A re-run of a committed batch does nothing and returns the
recorded count; a re-run of an uncommitted one first deletes what the crashed attempt
left, by its publishing record and its staging directory. Every file operation goes
through Hadoop's FileSystem API (``lake_fs``), so the root may be any Hadoop path.

A table's columns and partitioning are fixed by its first batch: a later batch with a
column missing, added or of another type is refused (KF721), as is a writer that
partitions differently (KF723).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampNTZType, TimestampType

from kappaflow.errors import LakeColumnError, LakePartitioningError
from kappaflow.streams.output.lake_fs import HadoopFs
from kappaflow.streams.output.lake_manifest import (
    MANIFEST_DIR,
    PUBLISHING_DIR,
    STAGING_DIR,
    DataFile,
    Manifest,
    check_schema,
    is_record,
    record_name,
)

#: The column ``by_date`` adds: the UTC date of the timestamp, a partition column.
DATE_COLUMN = "date"

#: The points inside ``write`` at which it calls its ``on_step`` function: Spark has
#: written the staging directory; the files are in the table's directories but the
#: manifest is not written; the manifest is written (staging not yet cleaned up). The
#: tests raise at each of them to show that a crash there is invisible and re-runs once.
STEPS = ("staged", "published", "committed")

#: Called with a step and the batch id.
StepHook = Callable[[str, int], None]

_MICROS_PER_DAY = 86_400_000_000


_TIMESTAMP_TYPE = "spark.sql.parquet.outputTimestampType"
#: Lake writes under way in this driver and the option's value before the first began.
#: Queries of one driver run their foreachBatch functions on threads of their own but share
#: the session's options: the option is set by the first write and put back by the last,
#: so that no write puts INT96 back while another's Spark job is starting.
_writes_lock = threading.Lock()
_writes: dict[int, tuple[int, str | None]] = {}


@contextmanager
def _micros_timestamps(spark: SparkSession) -> Iterator[None]:
    """Parquet timestamps as TIMESTAMP_MICROS for the writes inside; Spark's default INT96
    is deprecated in Parquet, and pyarrow and DuckDB read TIMESTAMP_MICROS as timestamps.
    Spark reads the option from the session only (a writer option does not override it)."""
    key = id(spark)
    with _writes_lock:
        running, previous = _writes.get(key, (0, None))
        if running == 0:
            previous = spark.conf.get(_TIMESTAMP_TYPE, None)
            spark.conf.set(_TIMESTAMP_TYPE, "TIMESTAMP_MICROS")
        _writes[key] = (running + 1, previous)
    try:
        yield
    finally:
        with _writes_lock:
            running, previous = _writes.pop(key)
            if running > 1:
                _writes[key] = (running - 1, previous)
            elif previous is None:
                spark.conf.unset(_TIMESTAMP_TYPE)
            else:
                spark.conf.set(_TIMESTAMP_TYPE, previous)


class LakeWriter:
    """Writes ``foreachBatch`` batches to a Parquet table at ``root``, exactly once.

    ``partition_by`` names the batch's columns to partition by; ``by_date`` names a
    timestamp column whose UTC date becomes a ``date=YYYY-MM-DD`` partition, ahead of the
    others. One writer per table: its batches are a query's, in order.
    """

    def __init__(
        self,
        spark: SparkSession,
        root: str,
        partition_by: Sequence[str] = (),
        by_date: str | None = None,
        on_step: StepHook | None = None,
    ) -> None:
        self.spark = spark
        self.fs = HadoopFs(spark, root)
        self.root = self.fs.root_uri
        self.by_date = by_date
        self.partition_by = ((DATE_COLUMN,) if by_date else ()) + tuple(partition_by)
        self.on_step = on_step
        self._latest: Manifest | None = None
        self._latest_read = False

    def write(self, frame: DataFrame, batch_id: int) -> int:
        """Write one batch; the number of rows it holds (recorded, if committed before)."""
        committed = self._manifest(batch_id)
        if committed is not None:
            self._clean_up(batch_id)  # a crash after the commit may have left staging
            return committed.rows
        self._undo(batch_id)
        frame = self._prepared(frame)
        schema = frame.schema.jsonValue()
        latest = self._latest_manifest()
        if latest is not None:
            if latest.partition_by != self.partition_by:
                raise LakePartitioningError(
                    f"lake table {self.root} is partitioned by {list(latest.partition_by)}, "
                    f"the writer by {list(self.partition_by)}"
                )
            check_schema(latest, schema, self.root)
        files = self._stage_and_publish(frame, batch_id)
        manifest = Manifest(batch_id, sum(f.rows for f in files), files, schema, self.partition_by)
        self.fs.write_atomically(f"{MANIFEST_DIR}/{record_name(batch_id)}", manifest.to_json())
        self._latest, self._latest_read = manifest, True
        self._step("committed", batch_id)
        self._clean_up(batch_id)
        return manifest.rows

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        """The writer as a ``foreachBatch`` function (which must return nothing)."""
        self.write(frame, batch_id)

    def _step(self, step: str, batch_id: int) -> None:
        if self.on_step is not None:
            self.on_step(step, batch_id)

    def _stage_and_publish(self, frame: DataFrame, batch_id: int) -> tuple[DataFile, ...]:
        """Write ``frame`` under staging, in an attempt's folder of its own, and move its
        files into the table's partitions: the batch's files, not yet committed."""
        attempt = uuid.uuid4().hex[:12]
        staging = f"{STAGING_DIR}/batch={batch_id}-{attempt}"
        with _micros_timestamps(self.spark):
            writer = frame.write.mode("errorifexists").partitionBy(*self.partition_by)
            writer.parquet(self.fs.uri(staging))
        self._step("staged", batch_id)
        files = self._publish(batch_id, attempt, staging)
        self._step("published", batch_id)
        return files

    def _prepared(self, frame: DataFrame) -> DataFrame:
        """The batch with its date column, its data columns first and its partition columns
        last (the order every reader returns)."""
        types = {field.name: field.dataType for field in frame.schema.fields}
        if self.by_date is not None:
            if DATE_COLUMN in types:
                raise LakeColumnError(
                    f"lake table {self.root}: by_date adds column {DATE_COLUMN!r}, "
                    "which the batch already has"
                )
            kind = types.get(self.by_date)
            if not isinstance(kind, TimestampType | TimestampNTZType):
                found = "missing" if kind is None else kind.simpleString()
                raise LakeColumnError(
                    f"lake table {self.root}: by_date column {self.by_date!r} must be a "
                    f"timestamp, it is {found}"
                )
            frame = frame.withColumn(DATE_COLUMN, _utc_date(self.by_date, kind))
        missing = [c for c in self.partition_by if c not in frame.columns]
        if missing:
            raise LakeColumnError(
                f"lake table {self.root}: partition column(s) {missing} not in the batch's "
                f"columns {frame.columns}"
            )
        data = [c for c in frame.columns if c not in self.partition_by]
        return frame.select(*data, *self.partition_by)

    def _publish(self, batch_id: int, attempt: str, staging: str) -> tuple[DataFile, ...]:
        """Move the staged Parquet files into the table; their publishing record first, so
        that a re-run after a crash finds and deletes them."""
        moves: list[tuple[str, DataFile]] = []
        for relative in self.fs.files_under(staging):
            directory, _, name = relative.rpartition("/")
            if not name.endswith(".parquet") or name.startswith((".", "_")):
                continue  # _SUCCESS, checksums
            rows = self.fs.parquet_rows(f"{staging}/{relative}")
            if rows == 0:
                continue  # Spark writes an empty file for an empty batch: nothing to read
            target = f"b{batch_id}-{attempt}-{name}"
            moves.append((relative, DataFile(f"{directory}/{target}".lstrip("/"), rows)))
        record = json.dumps({"batch_id": batch_id, "files": [f.path for _, f in moves]})
        self.fs.write_atomically(f"{PUBLISHING_DIR}/{record_name(batch_id)}", record)
        for relative, file in moves:
            self.fs.rename(f"{staging}/{relative}", file.path)
        return tuple(file for _, file in moves)

    def _undo(self, batch_id: int) -> None:
        """Delete what an uncommitted attempt at this batch left: its moved files (by its
        publishing record) and its staging directory."""
        record = f"{PUBLISHING_DIR}/{record_name(batch_id)}"
        if self.fs.exists(record):
            for path in json.loads(self.fs.read_text(record))["files"]:
                self.fs.delete(path)
        self._clean_up(batch_id)

    def _clean_up(self, batch_id: int) -> None:
        self.fs.delete(f"{PUBLISHING_DIR}/{record_name(batch_id)}")
        for entry in self.fs.children(STAGING_DIR):
            if entry.name.startswith(f"batch={batch_id}-"):
                self.fs.delete(f"{STAGING_DIR}/{entry.name}")

    def _manifest(self, batch_id: int) -> Manifest | None:
        path = f"{MANIFEST_DIR}/{record_name(batch_id)}"
        if not self.fs.exists(path):
            return None
        return Manifest.from_json(self.fs.read_text(path), self.fs.uri(path))

    def _latest_manifest(self) -> Manifest | None:
        """The table's last committed batch: its schema and partitioning are the table's."""
        if not self._latest_read:
            names = [e.name for e in self.fs.children(MANIFEST_DIR) if is_record(e.name)]
            if names:
                path = f"{MANIFEST_DIR}/{names[-1]}"
                self._latest = Manifest.from_json(self.fs.read_text(path), self.fs.uri(path))
            self._latest_read = True
        return self._latest


def _utc_date(column: str, kind: object) -> F.Column:
    """The UTC date of a timestamp, whatever the session's time zone: a TIMESTAMP's
    microseconds since the epoch are UTC; a TIMESTAMP_NTZ's wall clock is taken as UTC."""
    if isinstance(kind, TimestampNTZType):
        return F.to_date(F.col(column))
    days = F.floor(F.unix_micros(F.col(column)) / _MICROS_PER_DAY).cast("int")
    return F.date_from_unix_date(days)

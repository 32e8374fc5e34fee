"""The lake as Delta Lake tables: Spark writes the files in the tasks, Delta Kernel commits.

Each micro-batch is written as before (``lake.LakeWriter``): Spark's Parquet writer
writes the rows into a staging directory from the tasks, the files move into the table's
``key=value`` partition directories. The commit point is then one Delta transaction made
on the driver by Delta Kernel (``DeltaLake.java``), whose ``txn`` action records the
batch id for the writer's application id: the format refuses a second commit of a batch
(a re-run after a crash), and every Delta reader (Spark here, delta-rs, DuckDB over its
Arrow, Trino, Databricks) sees a batch whole or not at all. Files a crashed attempt moved
but never committed are in no Delta version: invisible, deleted by the re-run (its
publishing record) or by a vacuum.

Why Delta rather than Iceberg: Spark's partitioned Parquet output is already Delta's
layout (partition columns in the directories, values in the log, no field ids needed), a
table's versions are consecutive integers to time-travel by, and the idempotent commit is
the format's own ``txn`` action, which Kernel checks when it builds the transaction.

A table written by an earlier kappaflow (manifests under ``_kappaflow/manifest``) is
migrated in place by its first Delta write or by ``kappaflow lake migrate``: one commit
adds every file its manifests list, marked with its last batch id; the files stay where
they are and the manifests stay readable.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from kappaflow.errors import LakeCommitError, LakePartitioningError, LakeVersionError
from kappaflow.streams.jvm import jvm_engine
from kappaflow.streams.output.lake import LakeWriter, StepHook, _micros_timestamps
from kappaflow.streams.output.lake_fs import HadoopFs
from kappaflow.streams.output.lake_manifest import (
    MANIFEST_DIR,
    STAGING_DIR,
    DataFile,
    Manifest,
    check_schema,
    is_record,
)

#: The directory of a Delta table's log: its presence makes a root a Delta table.
DELTA_LOG = "_delta_log"
#: The application id a writer's batches are committed under (Delta's ``txn.appId``).
DEFAULT_APP_ID = "kappaflow"
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
#: How many of the newest commits a re-run of a committed batch looks through for its rows.
_RECENT_COMMITS = 50


def is_delta(fs: HadoopFs) -> bool:
    return fs.exists(DELTA_LOG)


def _kernel(spark: SparkSession) -> Any:
    return jvm_engine(spark).DeltaLake


def _conf(spark: SparkSession) -> Any:
    return spark._jsc.hadoopConfiguration()


def _call(what: str, root: str, method: Any, *args: Any) -> Any:
    """Call Kernel; its failures as KF760."""
    try:
        return method(*args)
    except Py4JJavaError as error:
        cause = error.java_exception
        raise LakeCommitError(
            f"Delta table {root}: {what} failed: {cause.getClass().getSimpleName()}: "
            f"{cause.getMessage()}"
        ) from None


def describe(spark: SparkSession, root: str) -> dict[str, Any] | None:
    """The Delta table's version, schema (Spark's JSON) and partition columns; None when
    ``root`` holds no Delta table."""
    fs = HadoopFs(spark, root)
    if not is_delta(fs):
        return None
    text = _call("read", fs.root_uri, _kernel(spark).describe, _conf(spark), fs.root_uri)
    return None if text is None else dict(json.loads(text))


def snapshot_manifest(spark: SparkSession, root: str, version: int | None = None) -> Manifest:
    """The Delta table at ``version`` (default: the latest) as one manifest: its live files
    (decoded paths relative to the root), rows, schema and partition columns, so that every
    reader of ``lake_read`` reads it as it reads a manifest table."""
    fs = HadoopFs(spark, root)
    kernel = _kernel(spark)
    table = json.loads(_call("read", fs.root_uri, kernel.describe, _conf(spark), fs.root_uri))
    if version is not None and not 0 <= version <= int(table["version"]):
        raise LakeVersionError(
            f"Delta table {fs.root_uri} has versions 0 to {table['version']}, not {version}"
        )
    at = -1 if version is None else version
    listing = json.loads(_call("read", fs.root_uri, kernel.files, _conf(spark), fs.root_uri, at))
    return _manifest(
        int(listing["version"]),
        [(unquote(f["relative"]), int(f["rows"])) for f in listing["files"]],
        table["schema"],
        table["partition_by"],
    )


def _manifest(
    version: int, files: list[tuple[str, int]], schema: dict[str, Any], partition_by: list[str]
) -> Manifest:
    data = tuple(DataFile(path, rows) for path, rows in files)
    return Manifest(version, sum(f.rows for f in data), data, schema, tuple(partition_by))


class DeltaLakeWriter(LakeWriter):
    """Writes ``foreachBatch`` batches to a Delta table at ``root``, exactly once: a batch
    is one Delta version, marked with ``app_id`` and the batch id.

    The same arguments as ``LakeWriter``, whose staging and publishing it reuses; the
    steps (``on_step``) are the same three.
    """

    def __init__(
        self,
        spark: SparkSession,
        root: str,
        partition_by: tuple[str, ...] | list[str] = (),
        by_date: str | None = None,
        on_step: StepHook | None = None,
        app_id: str = DEFAULT_APP_ID,
    ) -> None:
        super().__init__(spark, root, partition_by, by_date, on_step)
        self.app_id = app_id
        self._kernel = _kernel(spark)
        self._migrated = False

    def write(self, frame: DataFrame, batch_id: int) -> int:
        """Write one batch; the number of rows it holds (recorded, if committed before)."""
        if not self._migrated:
            migrate(self.spark, self.root, self.app_id)
            self._migrated = True
        committed = self._committed_batch()
        if committed >= batch_id:
            self._clean_up(batch_id)  # a crash after the commit may have left staging
            return self._recorded_rows(batch_id)
        self._undo(batch_id)
        frame = self._prepared(frame)
        schema = frame.schema.jsonValue()
        table = describe(self.spark, self.root)
        if table is not None:
            self._check(table, schema)
        files = self._stage_and_publish(frame, batch_id)
        added = [self._add(file.path, file.rows) for file in files]
        version = _call(
            "commit",
            self.root,
            self._kernel.commitBatch,
            _conf(self.spark),
            self.root,
            self.app_id,
            batch_id,
            json.dumps(schema),
            json.dumps(list(self.partition_by)),
            json.dumps(added),
        )
        if version < 0:
            # Another attempt committed this batch meanwhile: its files are the table's.
            self._undo(batch_id)
            return self._recorded_rows(batch_id)
        self._step("committed", batch_id)
        self._clean_up(batch_id)
        return sum(file.rows for file in files)

    def _committed_batch(self) -> int:
        method = self._kernel.committedBatch
        return int(_call("read", self.root, method, _conf(self.spark), self.root, self.app_id))

    def _check(self, table: dict[str, Any], schema: dict[str, Any]) -> None:
        partition_by = tuple(table["partition_by"])
        if partition_by != self.partition_by:
            raise LakePartitioningError(
                f"lake table {self.root} is partitioned by {list(partition_by)}, "
                f"the writer by {list(self.partition_by)}"
            )
        latest = Manifest(int(table["version"]), 0, (), table["schema"], partition_by)
        check_schema(latest, schema, self.root)

    def _add(self, path: str, rows: int) -> dict[str, Any]:
        """A file's ``add`` as DeltaLake.java takes it."""
        status = self.fs.status(path)
        return {
            "path": path,
            "size": status.size,
            "modified": status.modified,
            "rows": rows,
            "partition_values": partition_values(path),
        }

    def _recorded_rows(self, batch_id: int) -> int:
        """The rows the commit of ``batch_id`` added, from the newest commits' ``add``
        statistics (a re-run is of the last batch or so), or from its manifest if it was
        committed before the table became a Delta table; 0 if not found among them."""
        manifest = self._manifest(batch_id)
        if manifest is not None:
            return manifest.rows
        names = [
            e.name
            for e in self.fs.children(DELTA_LOG)
            if e.name.endswith(".json") and e.name[:-5].isdigit()
        ]
        for name in reversed(names[-_RECENT_COMMITS:]):
            actions = [
                json.loads(line)
                for line in self.fs.read_text(f"{DELTA_LOG}/{name}").splitlines()
                if line.strip()
            ]
            marks = [a["txn"] for a in actions if "txn" in a]
            if any(m["appId"] == self.app_id and m["version"] == batch_id for m in marks):
                return sum(
                    int(json.loads(a["add"].get("stats") or "{}").get("numRecords", 0))
                    for a in actions
                    if "add" in a
                )
        return 0


def partition_values(path: str) -> dict[str, str | None]:
    """A file's partition values from its ``key=value`` directories (Spark's escaping
    undone; its null directory is null), as Delta's log records them."""
    values: dict[str, str | None] = {}
    for part in path.split("/")[:-1]:
        key, sep, value = part.partition("=")
        if sep:
            text = unquote(value)
            values[unquote(key)] = None if text == _HIVE_NULL else text
    return values


def migrate(spark: SparkSession, root: str, app_id: str = DEFAULT_APP_ID) -> int | None:
    """Make a manifest table a Delta table in place: one commit of every file its manifests
    list, marked with its last batch id (so its writer goes on with the next). The version
    made, or None when there was nothing to migrate (no manifest, or already Delta)."""
    fs = HadoopFs(spark, root)
    if is_delta(fs):
        return None
    names = [e.name for e in fs.children(MANIFEST_DIR) if is_record(e.name)]
    if not names:
        return None
    manifests = [Manifest.from_json(fs.read_text(f"{MANIFEST_DIR}/{n}"), fs.uri(n)) for n in names]
    latest = manifests[-1]
    added = []
    for manifest in manifests:
        for file in manifest.files:
            status = fs.status(file.path)
            added.append(
                {
                    "path": file.path,
                    "size": status.size,
                    "modified": status.modified,
                    "rows": file.rows,
                    "partition_values": partition_values(file.path),
                }
            )
    version = _call(
        "migration",
        fs.root_uri,
        _kernel(spark).commitBatch,
        _conf(spark),
        fs.root_uri,
        app_id,
        latest.batch_id,
        json.dumps(latest.schema),
        json.dumps(list(latest.partition_by)),
        json.dumps(added),
    )
    return int(version) if version >= 0 else None


@dataclass(frozen=True)
class Optimized:
    """What ``optimize`` did: the version it made (None: nothing to compact), and the
    files it replaced and wrote."""

    version: int | None
    removed: int
    added: int


def optimize(spark: SparkSession, root: str, *, min_files: int = 2) -> Optimized:
    """Compact the table: every partition with at least ``min_files`` files is rewritten as
    one file by Spark's tasks, and one Delta commit replaces the small files by the new
    ones (``dataChange=false``: the rows do not change). Earlier versions still read their
    own files (time travel) until a vacuum deletes them."""
    fs = HadoopFs(spark, root)
    if not is_delta(fs):
        raise LakeVersionError(f"{fs.root_uri} is not a Delta table (`kappaflow lake migrate`)")
    kernel = _kernel(spark)
    listing = json.loads(_call("read", fs.root_uri, kernel.files, _conf(spark), fs.root_uri, -1))
    current = snapshot_manifest(spark, root, int(listing["version"]))
    encoded = {unquote(f["relative"]): str(f["relative"]) for f in listing["files"]}
    groups: dict[tuple[tuple[str, str | None], ...], list[str]] = {}
    for file in current.files:
        key = tuple(sorted(partition_values(file.path).items()))
        groups.setdefault(key, []).append(file.path)
    chosen = [path for paths in groups.values() if len(paths) >= min_files for path in paths]
    if not chosen:
        return Optimized(None, 0, 0)
    schema = StructType.fromJson(current.schema)
    frame = spark.read.schema(schema).option("basePath", fs.root_uri)
    rows = frame.parquet(*[fs.uri(path) for path in chosen])
    partition_by = list(current.partition_by)
    rows = rows.repartition(*partition_by) if partition_by else rows.coalesce(1)
    attempt = uuid.uuid4().hex[:12]
    staging = f"{STAGING_DIR}/optimize-{attempt}"
    with _micros_timestamps(spark):
        rows.write.mode("errorifexists").partitionBy(*partition_by).parquet(fs.uri(staging))
    added = []
    for relative in fs.files_under(staging):
        directory, _, name = relative.rpartition("/")
        if not name.endswith(".parquet") or name.startswith((".", "_")):
            continue
        count = fs.parquet_rows(f"{staging}/{relative}")
        if count == 0:
            continue
        target = f"{directory}/v{current.batch_id}-{attempt}-{name}".lstrip("/")
        fs.rename(f"{staging}/{relative}", target)
        status = fs.status(target)
        added.append(
            {
                "path": target,
                "size": status.size,
                "modified": status.modified,
                "rows": count,
                "partition_values": partition_values(target),
            }
        )
    fs.delete(staging)
    # Kernel names files by their URI-encoded paths.
    removed = [encoded[path] for path in chosen]
    version = _call(
        "optimize",
        fs.root_uri,
        _kernel(spark).rewrite,
        _conf(spark),
        fs.root_uri,
        current.batch_id,
        json.dumps(removed),
        json.dumps(added),
    )
    return Optimized(int(version), len(chosen), len(added))

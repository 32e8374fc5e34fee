"""Reading a lake table: only the files its manifests list, never a glob of the directory.

A Delta table (``_delta_log/``, what the job API writes: ``lake_delta``) is read as one
manifest of the files its version lists: through Delta Kernel with a SparkSession, through
delta-rs (``deltalake``) without one; ``version=`` reads an earlier version (time
travel). A manifest table of an earlier kappaflow is read as before; its ``version`` is a
batch id (the batches up to it).

A directory glob would also find the files of a batch that is being published or whose
attempt crashed; the manifests name exactly the committed ones. Partition columns come
back from the ``key=value`` directories with the types the table's schema gives them.

With a SparkSession the manifests are read through Hadoop (any Hadoop path). Without one
(``read_arrow``, DuckDB, ``committed_files(None, root)``) they are read through
``pyarrow.fs``: a plain path or a ``file:`` URI, or any URI pyarrow's file systems know
(``s3://``, ``gs://``, ``hdfs://`` with libhdfs), which is what readers outside Spark use.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from kappaflow.errors import LakeCommitError, LakeVersionError
from kappaflow.streams.output.lake_delta import DELTA_LOG, snapshot_manifest
from kappaflow.streams.output.lake_fs import HadoopFs
from kappaflow.streams.output.lake_manifest import MANIFEST_DIR, DataFile, Manifest, is_record

#: DuckDB's types for partition columns, by Spark type; a type not here is left to
#: DuckDB's own inference from the directory names.
_DUCKDB_TYPES = {
    "string": "VARCHAR",
    "date": "DATE",
    "boolean": "BOOLEAN",
    "byte": "TINYINT",
    "short": "SMALLINT",
    "integer": "INTEGER",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
}


class DuckDbConnection(Protocol):
    """What ``register_duckdb`` needs of a ``duckdb.DuckDBPyConnection``."""

    def execute(self, query: str) -> Any: ...

    def register(self, view_name: str, python_object: object) -> Any: ...


def committed_manifests(
    spark: SparkSession | None, root: str, version: int | None = None
) -> list[Manifest]:
    """The table's manifests in batch order (a Delta table's version as one); through
    Hadoop if ``spark`` is given. ``version``: a Delta table's version, a manifest table's
    last batch id."""
    if spark is not None:
        fs = HadoopFs(spark, root)
        if fs.exists(DELTA_LOG):
            return [snapshot_manifest(spark, root, version)]
        names = [e.name for e in fs.children(MANIFEST_DIR) if is_record(e.name)]
        paths = [f"{MANIFEST_DIR}/{name}" for name in names]
        return _up_to([Manifest.from_json(fs.read_text(p), fs.uri(p)) for p in paths], version)
    if is_delta_root(root):
        return [_delta_manifest(root, version)]
    arrow_fs, base = _arrow_fs(root)
    selector = pafs.FileSelector(f"{base}/{MANIFEST_DIR}", allow_not_found=True)
    infos = sorted(arrow_fs.get_file_info(selector), key=lambda info: info.base_name)
    manifests = []
    for info in infos:
        if info.type == pafs.FileType.File and is_record(info.base_name):
            with arrow_fs.open_input_stream(info.path) as stream:
                text = stream.read().decode()
            manifests.append(Manifest.from_json(text, info.path))
    return _up_to(manifests, version)


def is_delta_root(root: str) -> bool:
    """Whether ``root`` (a path or a URI pyarrow reaches) holds a Delta table."""
    arrow_fs, base = _arrow_fs(root)
    return bool(arrow_fs.get_file_info(f"{base}/{DELTA_LOG}").type == pafs.FileType.Directory)


def _up_to(manifests: list[Manifest], version: int | None) -> list[Manifest]:
    if version is None:
        return manifests
    if not any(m.batch_id <= version for m in manifests):
        raise LakeVersionError(f"the lake table has no batch at or before {version}")
    return [m for m in manifests if m.batch_id <= version]


def _delta_manifest(root: str, version: int | None) -> Manifest:
    """A Delta table's version through delta-rs, as one manifest."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    uri = re.sub(r"^s3[an]://", "s3://", root)
    try:
        table = DeltaTable(uri, version=version)
        actions = pa.table(table.get_add_actions(flatten=True))
        schema = json.loads(table.schema().to_json())
        partition_by = list(table.metadata().partition_columns)
        current = table.version()
    except DeltaError as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        if version is not None and _has_no_version(uri, version):
            raise LakeVersionError(f"lake table {root} has no version {version}") from None
        raise LakeCommitError(f"lake table {root}: {message}") from None
    files = [
        DataFile(unquote(str(path)), int(rows or 0))
        for path, rows in zip(
            actions.column("path").to_pylist(),
            actions.column("num_records").to_pylist(),
            strict=True,
        )
    ]
    return Manifest(current, sum(f.rows for f in files), tuple(files), schema, tuple(partition_by))


def delta_history(root: str) -> list[dict[str, Any]]:
    """A Delta table's versions, newest first: ``version``, ``time`` (ISO 8601, UTC),
    ``operation`` and ``batch`` (the batch id its ``txn`` action marks, if any)."""
    from deltalake import DeltaTable

    if not is_delta_root(root):
        raise LakeVersionError(
            f"{root} is not a Delta table (a manifest table: `kappaflow lake migrate`)"
        )
    arrow_fs, base = _arrow_fs(root)
    found = []
    for entry in DeltaTable(re.sub(r"^s3[an]://", "s3://", root)).history():
        version = int(entry["version"])
        batch = None
        try:
            with arrow_fs.open_input_stream(f"{base}/{DELTA_LOG}/{version:020d}.json") as stream:
                lines = stream.read().decode().splitlines()
            marks = [json.loads(line)["txn"] for line in lines if '"txn"' in line]
            batch = int(marks[0]["version"]) if marks else None
        except (FileNotFoundError, KeyError, ValueError):
            pass  # a commit file cleaned up after a checkpoint
        moment = datetime.fromtimestamp(int(entry["timestamp"]) / 1000, UTC)
        found.append(
            {
                "version": version,
                "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "operation": str(entry.get("operation", "")),
                "batch": batch,
            }
        )
    return found


def _has_no_version(uri: str, version: int) -> bool:
    from deltalake import DeltaTable

    return not 0 <= version <= DeltaTable(uri).version()


def committed_files(spark: SparkSession | None, root: str) -> list[str]:
    """Every committed data file, in batch order: Hadoop URIs with ``spark``, else paths of
    ``root``'s pyarrow file system (plain absolute paths for a local table)."""
    manifests = committed_manifests(spark, root)
    if spark is not None:
        fs = HadoopFs(spark, root)
        return [fs.uri(f.path) for m in manifests for f in m.files]
    _, base = _arrow_fs(root)
    return [f"{base}/{f.path}" for m in manifests for f in m.files]


def read_arrow(root: str, version: int | None = None) -> pa.Table:
    """The committed rows as an Arrow table (empty, without columns, before any batch);
    ``version``: an earlier version of the table."""
    rows = committed_dataset(root, committed_manifests(None, root, version))
    return rows if isinstance(rows, pa.Table) else rows.to_table()


def committed_dataset(root: str, manifests: list[Manifest]) -> ds.Dataset | pa.Table:
    """The files ``manifests`` list as one pyarrow dataset with the latest manifest's
    schema, partition columns from the ``key=value`` directories; an empty table while
    there is no file (without columns before any batch)."""
    if not manifests:
        return pa.table({})
    arrow_fs, base = _arrow_fs(root)
    latest = manifests[-1]
    schema = _arrow_schema(latest)
    files = [f"{base}/{f.path}" for m in manifests for f in m.files]
    if not files:
        return schema.empty_table()
    partitions = pa.schema([schema.field(name) for name in latest.partition_by])
    return ds.dataset(
        files,
        schema=schema,
        format="parquet",
        filesystem=arrow_fs,
        partitioning=ds.partitioning(partitions, flavor="hive"),
        partition_base_dir=base,
    )


def read_spark(spark: SparkSession, root: str, version: int | None = None) -> DataFrame:
    """The committed rows as a Spark DataFrame, with the table's schema; ``version``: an
    earlier version of the table."""
    manifests = committed_manifests(spark, root, version)
    if not manifests:
        return spark.createDataFrame([], StructType([]))
    schema = StructType.fromJson(manifests[-1].schema)
    fs = HadoopFs(spark, root)
    files = [fs.uri(f.path) for m in manifests for f in m.files]
    if not files:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).option("basePath", fs.root_uri).parquet(*files)


def duckdb_sql(root: str, version: int | None = None) -> str | None:
    """A DuckDB table expression over the committed files (for a ``FROM`` clause), or None
    while the table has no committed file (DuckDB cannot read an empty file list)."""
    manifests = committed_manifests(None, root, version)
    _, base = _arrow_fs(root)
    files = [f"{base}/{f.path}" for m in manifests for f in m.files]
    if not files:
        return None
    latest = manifests[-1].column_types()
    hive_types = ", ".join(
        f"{_quote(name)}: {_DUCKDB_TYPES[latest[name]]}"
        for name in manifests[-1].partition_by
        if latest[name] in _DUCKDB_TYPES
    )
    options = "hive_partitioning = true" + (
        f", hive_types = {{{hive_types}}}" if hive_types else ""
    )
    return f"read_parquet([{', '.join(map(_quote, files))}], {options})"


def register_duckdb(
    con: DuckDbConnection, name: str, root: str, version: int | None = None
) -> None:
    """Create (or replace) the view ``name`` over the committed rows on a DuckDB connection.
    Before the first committed file, the view is an empty table of the table's columns."""
    source = duckdb_sql(root, version)
    if source is None:
        con.register(name, read_arrow(root, version))
        return
    con.execute(
        f'CREATE OR REPLACE VIEW "{name.replace(chr(34), chr(34) * 2)}" AS SELECT * FROM {source}'
    )


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _arrow_fs(root: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system of a table's location, and the location's path in it (a
    Hadoop ``s3a://`` location is pyarrow's ``s3://``)."""
    if "://" in root or root.startswith("file:"):
        arrow_fs, path = pafs.FileSystem.from_uri(re.sub(r"^s3[an]://", "s3://", root))
        return arrow_fs, str(path).rstrip("/")
    return pafs.LocalFileSystem(), str(Path(root).resolve())


def _arrow_schema(manifest: Manifest) -> pa.Schema:
    return to_arrow_schema(StructType.fromJson(manifest.schema), timezone="UTC")

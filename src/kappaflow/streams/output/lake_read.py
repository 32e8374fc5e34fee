"""Reading a lake table: only the files its manifests list, never a glob of the directory.

A directory glob would also find the files of a batch that is being published or whose
attempt crashed; the manifests name exactly the committed ones. Partition columns come
back from the ``key=value`` directories with the types the table's schema gives them.

With a SparkSession the manifests are read through Hadoop (any Hadoop path). Without one
(``read_arrow``, DuckDB, ``committed_files(None, root)``) they are read through
``pyarrow.fs``: a plain path or a ``file:`` URI, or any URI pyarrow's file systems know
(``s3://``, ``gs://``, ``hdfs://`` with libhdfs), which is what readers outside Spark use.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from kappaflow.streams.output.lake_fs import HadoopFs
from kappaflow.streams.output.lake_manifest import MANIFEST_DIR, Manifest, is_record

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


def committed_manifests(spark: SparkSession | None, root: str) -> list[Manifest]:
    """The table's manifests in batch order; through Hadoop if ``spark`` is given."""
    if spark is not None:
        fs = HadoopFs(spark, root)
        names = [e.name for e in fs.children(MANIFEST_DIR) if is_record(e.name)]
        paths = [f"{MANIFEST_DIR}/{name}" for name in names]
        return [Manifest.from_json(fs.read_text(p), fs.uri(p)) for p in paths]
    arrow_fs, base = _arrow_fs(root)
    selector = pafs.FileSelector(f"{base}/{MANIFEST_DIR}", allow_not_found=True)
    infos = sorted(arrow_fs.get_file_info(selector), key=lambda info: info.base_name)
    manifests = []
    for info in infos:
        if info.type == pafs.FileType.File and is_record(info.base_name):
            with arrow_fs.open_input_stream(info.path) as stream:
                text = stream.read().decode()
            manifests.append(Manifest.from_json(text, info.path))
    return manifests


def committed_files(spark: SparkSession | None, root: str) -> list[str]:
    """Every committed data file, in batch order: Hadoop URIs with ``spark``, else paths of
    ``root``'s pyarrow file system (plain absolute paths for a local table)."""
    manifests = committed_manifests(spark, root)
    if spark is not None:
        fs = HadoopFs(spark, root)
        return [fs.uri(f.path) for m in manifests for f in m.files]
    _, base = _arrow_fs(root)
    return [f"{base}/{f.path}" for m in manifests for f in m.files]


def read_arrow(root: str) -> pa.Table:
    """The committed rows as an Arrow table (empty, without columns, before any batch)."""
    rows = committed_dataset(root, committed_manifests(None, root))
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


def read_spark(spark: SparkSession, root: str) -> DataFrame:
    """The committed rows as a Spark DataFrame, with the table's schema."""
    manifests = committed_manifests(spark, root)
    if not manifests:
        return spark.createDataFrame([], StructType([]))
    schema = StructType.fromJson(manifests[-1].schema)
    fs = HadoopFs(spark, root)
    files = [fs.uri(f.path) for m in manifests for f in m.files]
    if not files:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).option("basePath", fs.root_uri).parquet(*files)


def duckdb_sql(root: str) -> str | None:
    """A DuckDB table expression over the committed files (for a ``FROM`` clause), or None
    while the table has no committed file (DuckDB cannot read an empty file list)."""
    manifests = committed_manifests(None, root)
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


def register_duckdb(con: DuckDbConnection, name: str, root: str) -> None:
    """Create (or replace) the view ``name`` over the committed rows on a DuckDB connection.
    Before the first committed file, the view is an empty table of the table's columns."""
    source = duckdb_sql(root)
    if source is None:
        con.register(name, read_arrow(root))
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

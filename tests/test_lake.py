"""The Parquet lake sink: batches land once, readers see only committed ones, anywhere.

Batches are written with the real local Spark session, read back through Spark, pyarrow
and DuckDB, and crashes are injected at each step of ``write`` with its ``on_step`` hook.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kappaflow.errors import (
    LakeColumnError,
    LakeManifestError,
    LakePartitioningError,
    LakePublishError,
    LakeSchemaError,
)
from kappaflow.streams.output.lake import STEPS, LakeWriter
from kappaflow.streams.output.lake_fs import HadoopFs
from kappaflow.streams.output.lake_read import (
    committed_files,
    read_arrow,
    read_spark,
    register_duckdb,
)
from lake_batches import START, CrashError, batch


def expected(first: int, count: int) -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "amount": i * 1.5,
            "ts": START + timedelta(hours=i),
            "region": "eu" if i % 2 else "us",
            "date": (START + timedelta(hours=i)).date(),
        }
        for i in range(first, first + count)
    ]


def rows_of(table: pa.Table) -> list[dict[str, Any]]:
    """Rows by id, with every timestamp in UTC (DuckDB returns its session's zone)."""
    rows = [
        {k: v.astimezone(UTC) if isinstance(v, datetime) else v for k, v in row.items()}
        for row in table.to_pylist()
    ]
    return sorted(rows, key=lambda row: row["id"])


def duckdb_rows(root: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    con = duckdb.connect()
    try:
        register_duckdb(con, "lake", root)
        types = {name: str(kind) for name, kind, *_ in con.execute("DESCRIBE lake").fetchall()}
        return rows_of(con.sql("SELECT * FROM lake").arrow().read_all()), types
    finally:
        con.close()


def data_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet") if "_staging" not in p.parts)


@contextmanager
def session_time_zone(spark: SparkSession, zone: str) -> Iterator[None]:
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        yield
    finally:
        spark.conf.set("spark.sql.session.timeZone", str(previous))


def test_three_batches_read_back_equal_from_spark_arrow_and_duckdb(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = str(tmp_path / "orders")
    writer = LakeWriter(spark, root, partition_by=["region"], by_date="ts")
    # A session zone west of UTC would put 22:00 UTC on the previous day; the date
    # partition is the UTC date regardless.
    option = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(option)
    with session_time_zone(spark, "America/Los_Angeles"):
        counts = [writer.write(batch(spark, 4 * n), n) for n in range(3)]
    assert counts == [4, 4, 4]
    assert spark.conf.get(option) == before != "TIMESTAMP_MICROS"  # set for the writes only
    want = expected(0, 12)

    from_spark = read_spark(spark, root)
    assert dict(from_spark.dtypes) == {
        "id": "int",
        "amount": "double",
        "ts": "timestamp",
        "region": "string",
        "date": "date",
    }
    assert rows_of(from_spark.toArrow()) == want

    from_arrow = read_arrow(root)
    assert from_arrow.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert from_arrow.schema.field("date").type == pa.date32()
    assert rows_of(from_arrow) == want

    from_duckdb, types = duckdb_rows(root)
    assert types["ts"] == "TIMESTAMP WITH TIME ZONE"
    assert (types["date"], types["region"]) == ("DATE", "VARCHAR")
    assert from_duckdb == want


def test_partition_by_and_by_date_layout_on_disk(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "orders"
    LakeWriter(spark, str(root), partition_by=["region"], by_date="ts").write(batch(spark, 0), 7)
    layout = {p.relative_to(root).parent.as_posix() for p in data_files(root)}
    assert layout == {
        "date=2026-11-23/region=us",
        "date=2026-11-23/region=eu",
        "date=2026-11-24/region=us",
        "date=2026-11-24/region=eu",
    }
    assert all(p.name.startswith("b7-") for p in data_files(root))
    manifest = json.loads((root / "_kappaflow/manifest/00000000000000000007.json").read_text())
    assert manifest["rows"] == 4
    assert manifest["partition_by"] == ["date", "region"]
    listed = sorted(f["path"] for f in manifest["files"])
    assert listed == sorted(p.relative_to(root).as_posix() for p in data_files(root))
    assert list((root / "_staging").iterdir()) == []
    assert not (root / "_kappaflow/publishing").exists() or not any(
        (root / "_kappaflow/publishing").iterdir()
    )

    plain = tmp_path / "plain"
    LakeWriter(spark, str(plain)).write(batch(spark, 0), 0)
    assert {p.parent for p in data_files(plain)} == {plain}
    assert rows_of(read_arrow(str(plain))) == [
        {k: v for k, v in row.items() if k != "date"} for row in expected(0, 4)
    ]


def test_rerunning_a_committed_batch_changes_nothing(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "orders"
    LakeWriter(spark, str(root), by_date="ts").write(batch(spark, 0), 0)
    before = data_files(root)
    # A new driver re-runs batch 0 (Spark's rows are the same; these differ, to show that
    # nothing is written at all).
    assert LakeWriter(spark, str(root), by_date="ts").write(batch(spark, 100), 0) == 4
    assert data_files(root) == before
    assert rows_of(read_arrow(str(root))) == expected(0, 4)


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_is_invisible_and_the_rerun_writes_once(
    spark: SparkSession, tmp_path: Path, step: str
) -> None:
    root = str(tmp_path / "orders")
    LakeWriter(spark, root, partition_by=["region"]).write(batch(spark, 0), 0)

    def crash(at: str, batch_id: int) -> None:
        if at == step:
            raise CrashError(f"{at} {batch_id}")

    crashing = LakeWriter(spark, root, partition_by=["region"], on_step=crash)
    with pytest.raises(CrashError):
        crashing.write(batch(spark, 4), 1)
    committed = expected(0, 8) if step == "committed" else expected(0, 4)
    strip = {"date"}
    want = [{k: v for k, v in r.items() if k not in strip} for r in committed]
    assert rows_of(read_arrow(root)) == want
    assert rows_of(read_spark(spark, root).toArrow()) == want
    if step == "published":
        # The crashed attempt's files are in the partition directories, unlisted.
        assert len(data_files(Path(root))) > len(committed_files(None, root))

    assert LakeWriter(spark, root, partition_by=["region"]).write(batch(spark, 4), 1) == 4
    want = [{k: v for k, v in r.items() if k not in strip} for r in expected(0, 8)]
    assert rows_of(read_arrow(root)) == want
    assert duckdb_rows(root)[0] == want
    # Nothing of the crashed attempt is left: every data file is committed, staging is gone.
    assert [str(p) for p in data_files(Path(root))] == sorted(committed_files(None, root))
    assert list((Path(root) / "_staging").iterdir()) == []


def test_a_streaming_query_writes_its_batches_through_foreach_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    for n in range(2):
        lines = [
            json.dumps({"id": r["id"], "region": r["region"], "ts": r["ts"].isoformat()})
            for r in expected(4 * n, 4)
        ]
        (source / f"{n}.json").write_text("\n".join(lines) + "\n")
    root = str(tmp_path / "orders")
    writer = LakeWriter(spark, root, by_date="ts")
    query = (
        spark.readStream.schema("id INT, region STRING, ts TIMESTAMP")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(writer)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the query did not finish its two files in 120 s"
    assert query.exception() is None
    manifests = sorted(p.name for p in (tmp_path / "orders/_kappaflow/manifest").glob("*.json"))
    assert manifests == ["00000000000000000000.json", "00000000000000000001.json"]
    want = [{k: v for k, v in r.items() if k != "amount"} for r in expected(0, 8)]
    assert rows_of(read_arrow(root)) == want


def test_a_file_uri_root_works_as_a_plain_path(spark: SparkSession, tmp_path: Path) -> None:
    uri = (tmp_path / "orders").as_uri()
    assert uri.startswith("file:///")
    writer = LakeWriter(spark, uri, by_date="ts")
    for n in range(2):
        writer.write(batch(spark, 4 * n), n)
    want = expected(0, 8)
    assert rows_of(read_spark(spark, uri).toArrow()) == want
    assert rows_of(read_arrow(uri)) == want
    assert duckdb_rows(uri)[0] == want
    assert committed_files(None, uri) == committed_files(None, str(tmp_path / "orders"))
    assert [f.removeprefix("file:") for f in committed_files(spark, uri)] == committed_files(
        None, uri
    )


def test_an_empty_batch_commits_its_schema_and_no_file(spark: SparkSession, tmp_path: Path) -> None:
    root = str(tmp_path / "orders")
    assert read_arrow(root).num_rows == 0
    assert LakeWriter(spark, root, by_date="ts").write(batch(spark, 0, count=0), 0) == 0
    assert committed_files(None, root) == []
    assert read_arrow(root).column_names == ["id", "region", "ts", "amount", "date"]
    assert read_spark(spark, root).count() == 0
    assert duckdb_rows(root)[0] == []


def test_a_batch_with_another_schema_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    root = str(tmp_path / "orders")
    writer = LakeWriter(spark, root, by_date="ts")
    writer.write(batch(spark, 0), 0)
    retyped = batch(spark, 4).withColumn("amount", F.col("amount").cast("string"))
    with pytest.raises(LakeSchemaError, match="'amount' is string in the batch, double") as e:
        writer.write(retyped, 1)
    assert e.value.code == "KF721"
    with pytest.raises(LakeSchemaError, match="no column 'amount'"):
        LakeWriter(spark, root, by_date="ts").write(batch(spark, 4).drop("amount"), 1)
    with pytest.raises(LakeSchemaError, match="adds column"):
        writer.write(batch(spark, 4).withColumn("zone", F.col("region")), 1)
    assert writer.write(batch(spark, 4), 1) == 4
    assert rows_of(read_arrow(root)) == expected(0, 8)


def test_bad_partition_columns_are_refused(spark: SparkSession, tmp_path: Path) -> None:
    root = str(tmp_path / "orders")
    with pytest.raises(LakeColumnError, match="partition column\\(s\\) \\['country'\\]") as e:
        LakeWriter(spark, root, partition_by=["country"]).write(batch(spark, 0), 0)
    assert e.value.code == "KF722"
    with pytest.raises(LakeColumnError, match="'amount' must be a timestamp, it is double"):
        LakeWriter(spark, root, by_date="amount").write(batch(spark, 0), 0)
    dated = batch(spark, 0).withColumn("date", F.col("ts").cast("date"))
    with pytest.raises(LakeColumnError, match="already has"):
        LakeWriter(spark, root, by_date="ts").write(dated, 0)

    LakeWriter(spark, root, partition_by=["region"]).write(batch(spark, 0), 0)
    with pytest.raises(LakePartitioningError, match=r"by \['region'\], the writer by \[\]") as p:
        LakeWriter(spark, root).write(batch(spark, 4), 1)
    assert p.value.code == "KF723"


def test_a_damaged_manifest_or_a_refused_rename_is_an_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "orders"
    LakeWriter(spark, str(root)).write(batch(spark, 0), 0)
    (root / "_kappaflow/manifest/00000000000000000001.json").write_text("{not json")
    with pytest.raises(LakeManifestError, match=r"00000000000000000001\.json") as e:
        read_arrow(str(root))
    assert e.value.code == "KF724"

    # HDFS refuses a rename onto an existing file by returning false; the local file
    # system overwrites instead, so its answer is turned into HDFS's here.
    fs = HadoopFs(spark, str(root))
    fs._fs = RefusingRenames(fs._fs)
    with pytest.raises(LakePublishError, match=r"refused to rename .*/a\.json to .*/b\.json") as r:
        fs.write_atomically("b.json", "{}")
        fs.write_atomically("a.json", "{}")
        fs.rename("a.json", "b.json")
    assert r.value.code == "KF725"
    assert (root / "b.json").exists()


class RefusingRenames:
    """A Hadoop FileSystem that refuses a rename onto an existing path, as HDFS does."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def rename(self, source: Any, target: Any) -> bool:
        return not self.fs.exists(target) and bool(self.fs.rename(source, target))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)

"""The lake as Delta tables: Spark's tasks write the files, Delta Kernel commits each batch.

Every table is read back by a second engine that shares no code with the writer: delta-rs
(the ``deltalake`` package) reads the Delta log, DuckDB queries its Arrow. Crashes are
injected at each step of ``write`` with its ``on_step`` hook, as for the manifest lake.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from conftest import error_line, run_kappaflow
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from kappaflow.api.sql import describe_tables, run_sql
from kappaflow.errors import LakeSchemaError
from kappaflow.settings import Settings
from kappaflow.streams.output.lake import STEPS, LakeWriter
from kappaflow.streams.output.lake_delta import DeltaLakeWriter, migrate, optimize
from kappaflow.streams.output.lake_delta_log import drop_batches_after, last_batch, schema_at
from kappaflow.streams.output.lake_read import (
    delta_history,
    read_arrow,
    read_spark,
    register_duckdb,
)
from lake_batches import CrashError, batch


def ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


def delta_rs(root: Path, version: int | None = None) -> pa.Table:
    """The table as delta-rs reads it: no kappaflow code involved."""
    return DeltaTable(str(root), version=version).to_pyarrow_table()


def duckdb_over_delta_rs(root: Path, query: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    try:
        con.register("t", delta_rs(root))
        return list(con.execute(query).fetchall())
    finally:
        con.close()


def writer(spark: SparkSession, root: Path, **kwargs: Any) -> DeltaLakeWriter:
    return DeltaLakeWriter(spark, str(root), partition_by=["region"], by_date="ts", **kwargs)


def test_each_batch_is_one_delta_version_read_back_by_delta_rs_and_duckdb(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "orders"
    lake = writer(spark, root)
    assert [lake.write(batch(spark, 4 * b), b) for b in range(3)] == [4, 4, 4]

    table = DeltaTable(str(root))
    assert table.version() == 2
    assert table.metadata().partition_columns == ["date", "region"]
    assert table.transaction_version("kappaflow") == 2
    assert ids(delta_rs(root)) == list(range(12))
    # DuckDB over delta-rs's Arrow: the dates come from the log's partition values.
    by_date = duckdb_over_delta_rs(root, "SELECT date, count(*) FROM t GROUP BY 1 ORDER BY 1")
    assert [(str(d), n) for d, n in by_date] == [
        ("2026-11-23", 2),
        ("2026-11-24", 10),
    ]
    # Spark reads the files Kernel lists; kappaflow's own Arrow and DuckDB readers agree.
    assert sorted(r.id for r in read_spark(spark, str(root)).collect()) == list(range(12))
    assert ids(read_arrow(str(root))) == list(range(12))
    con = duckdb.connect()
    try:
        register_duckdb(con, "lake", str(root))
        assert con.execute("SELECT count(*), sum(amount) FROM lake").fetchone() == (12, 99.0)
    finally:
        con.close()
    # Each version is a batch, marked with its id.
    assert [(h["version"], h["batch"]) for h in delta_history(str(root))] == [
        (2, 2),
        (1, 1),
        (0, 0),
    ]


def test_rerunning_a_committed_batch_makes_no_version(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "orders"
    lake = writer(spark, root)
    lake.write(batch(spark, 0), 0)
    lake.write(batch(spark, 4), 1)
    files = sorted(p.name for p in root.rglob("*.parquet"))

    assert writer(spark, root).write(batch(spark, 4), 1) == 4  # the recorded count
    assert writer(spark, root).write(batch(spark, 0), 0) == 4
    assert DeltaTable(str(root)).version() == 1
    assert ids(delta_rs(root)) == list(range(8))
    assert sorted(p.name for p in root.rglob("*.parquet")) == files


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_is_invisible_and_the_rerun_writes_once(
    spark: SparkSession, tmp_path: Path, step: str
) -> None:
    root = tmp_path / "orders"
    writer(spark, root).write(batch(spark, 0), 0)

    def crash(at: str, batch_id: int) -> None:
        if at == step and batch_id == 1:
            raise CrashError(at)

    with pytest.raises(CrashError):
        writer(spark, root, on_step=crash).write(batch(spark, 4), 1)
    committed = step == "committed"
    # Other engines see the batch whole or not at all.
    assert ids(delta_rs(root)) == list(range(8 if committed else 4))

    assert writer(spark, root).write(batch(spark, 4), 1) == 4
    assert DeltaTable(str(root)).version() == 1
    assert ids(delta_rs(root)) == list(range(8))
    # The crashed attempt's files are gone (or are the committed ones), staging is empty.
    live = {Path(uri).resolve() for uri in DeltaTable(str(root)).file_uris()}
    on_disk = {p.resolve() for p in root.rglob("*.parquet")}
    assert on_disk == live


def test_time_travel_reads_each_version(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "orders"
    lake = writer(spark, root)
    for b in range(3):
        lake.write(batch(spark, 4 * b), b)

    assert ids(read_arrow(str(root), version=0)) == list(range(4))
    assert ids(read_arrow(str(root), version=1)) == list(range(8))
    assert sorted(r.id for r in read_spark(spark, str(root), version=1).collect()) == list(range(8))
    with pytest.raises(LookupError) as missing:
        read_arrow(str(root), version=7)
    assert missing.value.code == "KF761"  # type: ignore[attr-defined]
    with pytest.raises(LookupError) as too_far:
        read_spark(spark, str(root), version=7)
    assert too_far.value.code == "KF761"  # type: ignore[attr-defined]


def test_optimize_compacts_in_one_commit_and_earlier_versions_still_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "orders"
    lake = writer(spark, root)
    for b in range(4):
        lake.write(batch(spark, 4 * b, count=2), b)
    before = DeltaTable(str(root))
    assert len(before.file_uris()) == 8

    done = optimize(spark, str(root))

    after = DeltaTable(str(root))
    assert (done.version, after.version()) == (4, 4)
    # A row per file: 2026-11-23 has one file per region, 2026-11-24 three, which become one.
    assert (done.removed, done.added, len(after.file_uris())) == (6, 2, 4)
    assert ids(delta_rs(root)) == sorted(4 * b + i for b in range(4) for i in range(2))
    assert ids(delta_rs(root, version=3)) == ids(delta_rs(root))
    assert len(DeltaTable(str(root), version=3).file_uris()) == 8  # time travel still works
    assert next(h["operation"] for h in delta_history(str(root))) == "Manual Update"
    # A table with one file per partition has nothing to compact.
    assert optimize(spark, str(root)).version is None
    # The writer goes on after a compaction.
    assert lake.write(batch(spark, 100, count=2), 4) == 2
    assert len(ids(delta_rs(root))) == 10


def test_a_manifest_table_is_migrated_by_its_next_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "orders"
    old = LakeWriter(spark, str(root), partition_by=["region"], by_date="ts")
    old.write(batch(spark, 0), 0)
    old.write(batch(spark, 4), 1)
    assert not (root / "_delta_log").exists()

    lake = writer(spark, root)
    assert lake.write(batch(spark, 4), 1) == 4  # committed before, as a manifest batch
    assert lake.write(batch(spark, 8), 2) == 4

    table = DeltaTable(str(root))
    assert (table.version(), table.transaction_version("kappaflow")) == (1, 2)
    assert ids(delta_rs(root)) == list(range(12))
    assert ids(read_arrow(str(root))) == list(range(12))
    assert (root / "_kappaflow/manifest").is_dir()  # left as they were
    assert migrate(spark, str(root)) is None  # already Delta


def test_a_batch_with_another_schema_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "orders"
    writer(spark, root).write(batch(spark, 0), 0)
    other = batch(spark, 4).withColumnRenamed("amount", "total")
    with pytest.raises(LakeSchemaError) as refused:
        writer(spark, root).write(other, 1)
    assert refused.value.code == "KF721"
    assert DeltaTable(str(root)).version() == 0


def test_a_damaged_log_is_an_error(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "orders"
    lake = writer(spark, root)
    lake.write(batch(spark, 0), 0)
    lake.write(batch(spark, 4), 1)
    (root / "_delta_log" / f"{1:020d}.json").write_text("{not json\n")
    with pytest.raises(Exception) as damaged:
        writer(spark, root).write(batch(spark, 8), 2)
    assert damaged.value.code == "KF760"  # type: ignore[attr-defined]


def test_sql_reads_a_jobs_delta_table_at_any_version(
    spark: SparkSession, kafka: Settings, tmp_path: Path
) -> None:
    from test_api_sql import write_lake_job

    settings = kafka.model_copy(update={"state_dir": tmp_path / "state"})
    lake = write_lake_job(settings, "shop-2", {"orders": False})
    root = lake / "orders"
    orders = writer(spark, root)
    for b in range(3):
        orders.write(batch(spark, 4 * b), b)

    (item,) = describe_tables(settings)
    assert (item["format"], item["version"], item["rows"]) == ("delta", 2, 12)
    query = 'SELECT count(*) FROM "shop-2".orders'
    assert run_sql(settings, query).rows == [[12]]
    assert run_sql(settings, query, versions={"shop-2.orders": 0}).rows == [[4]]
    with pytest.raises(LookupError) as unknown:
        run_sql(settings, query, versions={"shop-2.nope": 0})
    assert unknown.value.code == "KF863"  # type: ignore[attr-defined]

    shown = run_kappaflow(settings, "sql", query, "--version", "shop-2.orders=1", "--json")
    assert shown.code == 0, shown.err
    assert [json.loads(line) for line in shown.lines()] == [{"count_star()": 8}]
    history = run_kappaflow(settings, "lake", "history", "shop-2.orders", "--json")
    assert [json.loads(line)["batch"] for line in history.lines()] == [2, 1, 0]
    too_far = run_kappaflow(settings, "sql", query, "--version", "shop-2.orders=9")
    assert "versions 0 to 2" in error_line(too_far, "KF761", 2) or "no version" in too_far.err


def test_the_lake_commands(spark: SparkSession, kafka: Settings, tmp_path: Path) -> None:
    settings = kafka.model_copy(update={"state_dir": tmp_path / "state"})
    root = tmp_path / "orders"
    old = LakeWriter(spark, str(root), partition_by=["region"])
    for b in range(3):
        old.write(batch(spark, 4 * b), b)

    before = len(list(root.rglob("*.parquet")))
    refused = run_kappaflow(settings, "lake", "history", str(root))
    assert "lake migrate" in error_line(refused, "KF761", 2)
    migrated = run_kappaflow(settings, "lake", "migrate", str(root), timeout=300)
    assert migrated.code == 0, migrated.err
    assert "Delta table, version 0" in migrated.err
    assert DeltaTable(str(root)).transaction_version("kappaflow") == 2
    compacted = run_kappaflow(settings, "lake", "optimize", str(root), timeout=300)
    assert compacted.code == 0, compacted.err
    assert f"version 1 replaced {before} files by 2" in compacted.err
    assert ids(delta_rs(root)) == list(range(12))
    assert ids(delta_rs(root, version=0)) == list(range(12))


def test_a_restore_takes_later_batches_out_and_the_job_writes_them_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    """What restoring a savepoint does to a Delta table (jobs/restore.py)."""
    root = tmp_path / "orders"
    lake = writer(spark, root)
    for b in range(3):
        lake.write(batch(spark, 4 * b, count=2), b)
    optimize(spark, str(root))  # after the savepoint's batch: compacts batch 0's files too
    lake.write(batch(spark, 20, count=2), 3)
    schema = schema_at(root, 0)
    assert last_batch(root) == 3 and schema is not None and schema["fields"][0]["name"] == "id"

    drop_batches_after(root, 0)

    assert last_batch(root) == 0
    assert DeltaTable(str(root)).version() == 0
    assert ids(delta_rs(root)) == [0, 1]
    live = {Path(uri).resolve() for uri in DeltaTable(str(root)).file_uris()}
    assert {p.resolve() for p in root.rglob("*.parquet")} == live
    assert writer(spark, root).write(batch(spark, 40, count=2), 1) == 2
    assert ids(delta_rs(root)) == [0, 1, 40, 41]

    drop_batches_after(root, None)
    assert not (root / "_delta_log").exists() and not list(root.rglob("*.parquet"))


def test_a_job_joins_a_delta_table_by_its_live_files_only(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``job.table_from_lake``: after a compaction the replaced files are still on disk,
    and a glob of the directory would read every row twice."""
    from kappaflow.streams.joins import lake_table

    root = tmp_path / "orders"
    lake = writer(spark, root)
    for b in range(3):
        lake.write(batch(spark, 4 * b), b)
    optimize(spark, str(root))

    table = lake_table(spark, str(root), ("id",))
    assert sorted(r.id for r in table.frame.collect()) == list(range(12))

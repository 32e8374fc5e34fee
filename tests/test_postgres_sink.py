"""The embedded PostgreSQL (``kappaflow postgres``) and the ``kf.postgres()`` sink's writer
against the real server: each (batch, partition) written once in a transaction with its
marker, corrections updating a window's row in place, a merged session's row deleted,
a stream's records upserted by their key with typed columns."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import error_line, run_kappaflow
from pg_server import pg  # noqa: F401 (a fixture: see its uses)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kappaflow.errors import PostgresUnreachableError
from kappaflow.postgresql.server import connect
from kappaflow.procs import free_port
from kappaflow.settings import Settings, load_settings
from kappaflow.streams.output.postgres import (
    PostgresWriter,
    aggregate_table,
    stream_table,
)
from kappaflow.streams.runtime import _shaped

pytestmark = pytest.mark.integration

MINUTE = 60_000
START = 1_795_428_000_000  # 2026-11-23T10:00:00Z


def _at(millis: int) -> datetime:
    return datetime.fromtimestamp(millis / 1000, UTC)


def _checkpoint(tmp_path: Path, query: str) -> str:
    """A checkpoint folder with the metadata Spark writes (the query's id)."""
    folder = tmp_path / "checkpoint"
    folder.mkdir(exist_ok=True)
    (folder / "metadata").write_text(json.dumps({"id": query}) + "\n")
    return str(folder)


def _changes(spark: SparkSession, rows: list[tuple[Any, ...]], partitions: int) -> DataFrame:
    """Changes of a window operator: (kind, key, window start, values, version, watermark)."""
    frame = spark.createDataFrame(
        [
            (kind, key, start, start + MINUTE, values, version, watermark)
            for kind, key, start, values, version, watermark in rows
        ],
        "kind string, key string, window_start bigint, window_end bigint, values string, "
        "version bigint, watermark bigint",
    )
    # Each key's changes in one partition, as the window operator's shuffle leaves them.
    return _shaped(frame).repartition(partitions, "key")


def _table(settings: Settings, sql: str) -> list[tuple[Any, ...]]:
    with connect(settings.postgres.effective_dsn) as conn:
        return sorted(conn.execute(sql).fetchall())


def test_a_window_is_a_row_corrected_in_place_and_a_batch_run_again_writes_nothing(
    pg: Settings,  # noqa: F811
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    dsn = pg.postgres.effective_dsn
    table = aggregate_table(
        "rev_windows",
        dsn,
        keys=[("country", StringType())],
        values=[("total", DoubleType()), ("orders", LongType())],
    )
    writer = PostgresWriter(table)
    checkpoint = _checkpoint(tmp_path, "q-1")

    def write(batch: int, rows: list[tuple[Any, ...]]) -> int:
        return writer.write("j", "revenue", batch, _changes(spark, rows, 2), None, checkpoint)

    first = [
        ("provisional", '["DE"]', START, '{"total": 10.0, "orders": 1}', 1, 0),
        ("final", '["DE"]', START, '{"total": 40.0, "orders": 2}', 2, START + MINUTE),
        ("provisional", '["FR"]', START, '{"total": 7.5, "orders": 1}', 1, 0),
        ("provisional", '["FR"]', START + MINUTE, '{"total": 1.0, "orders": 1}', 1, 0),
    ]
    assert write(0, first) == 4
    query = "SELECT country, window_start, window_end, total, orders, kind, version, final "
    query += "FROM rev_windows"
    assert _table(pg, query) == [
        ("DE", _at(START), _at(START + MINUTE), 40.0, 2, "final", 2, True),
        ("FR", _at(START), _at(START + MINUTE), 7.5, 1, "provisional", 1, False),
        ("FR", _at(START + MINUTE), _at(START + 2 * MINUTE), 1.0, 1, "provisional", 1, False),
    ]
    # A correction updates DE's row; a change without values (a session merged into
    # another) deletes FR's second window.
    second = [
        ("correction", '["DE"]', START, '{"total": 60.0, "orders": 3}', 3, START + 2 * MINUTE),
        ("provisional", '["FR"]', START + MINUTE, None, 2, START + 2 * MINUTE),
    ]
    write(1, second)
    expected = [
        ("DE", _at(START), _at(START + MINUTE), 60.0, 3, "correction", 3, True),
        ("FR", _at(START), _at(START + MINUTE), 7.5, 1, "provisional", 1, False),
    ]
    assert _table(pg, query) == expected
    # Batch 1 run again (after a crash): its partitions' markers are committed, so even
    # rows that differed would write nothing.
    different = [(k, key, s, '{"total": 99.0, "orders": 9}', v, w) for k, key, s, _, v, w in second]
    assert write(1, different) == 2
    assert _table(pg, query) == expected
    markers = _table(pg, "SELECT output, batch, rows FROM kappaflow_markers WHERE job = 'j'")
    assert {(o, b) for o, b, _ in markers} == {("revenue@q-1", 0), ("revenue@q-1", 1)}
    assert [sum(n for _, b, n in markers if b == batch) for batch in (0, 1)] == [4, 2]
    # A new query of the output (its checkpoint removed and started anew) writes batch 1.
    other = PostgresWriter(table)
    other.write(
        "j", "revenue", 1, _changes(spark, different, 2), None, _checkpoint(tmp_path, "q-2")
    )
    assert ("DE", 99.0) in [(c, t) for c, _, _, t, *_ in _table(pg, query)]


def test_a_partition_committed_before_is_skipped_and_the_others_written(
    pg: Settings,  # noqa: F811
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    """A task that died after its commit while another had not committed: the re-run
    writes only the partition whose marker is missing."""
    table = aggregate_table("by_part", pg.postgres.effective_dsn, [("k", StringType())], [])
    writer = PostgresWriter(table)
    writer.prepare()
    with connect(pg.postgres.effective_dsn) as conn:
        conn.execute("INSERT INTO kappaflow_markers VALUES ('p', 'o@q', 5, 1, 0, now())")
    # Two partitions: "a" in the first, "b" in the second (committed before).
    rows = [("final", '["a"]', START, "{}", 1, 0), ("final", '["b"]', START, "{}", 1, 0)]
    frame = _changes(spark, rows, 1).repartitionByRange(2, "key")
    placed = frame.select("key", F.spark_partition_id().alias("p")).collect()
    assert sorted((r["key"], r["p"]) for r in placed) == [('["a"]', 0), ('["b"]', 1)]
    writer.write("p", "o", 5, frame, None, _checkpoint(tmp_path, "q"))
    assert _table(pg, "SELECT k FROM by_part") == [("a",)]


def test_a_streams_records_are_upserted_by_their_key_with_typed_columns(
    pg: Settings,  # noqa: F811
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    schema = StructType(
        [
            StructField("device", StringType()),
            StructField("reading", DoubleType()),
            StructField("at", TimestampType()),
            StructField("tags", StructType([StructField("site", StringType())])),
        ]
    )
    table = stream_table("latest_readings", pg.postgres.effective_dsn, schema, ["device"])
    records = [
        {"device": "d1", "reading": 1.5, "at": "2026-11-23T10:00:01.000Z", "tags": {"site": "x"}},
        {"device": "d2", "reading": 2.0, "at": "2026-11-23T10:00:02.000Z", "tags": None},
        {"device": "d1", "reading": 3.5, "at": "2026-11-23T10:00:03.000Z", "tags": {"site": "y"}},
    ]
    frame = _shaped(
        spark.createDataFrame(
            [("record", json.dumps(r)) for r in records], "kind string, row string"
        ).coalesce(1)
    )
    writer = PostgresWriter(table)
    assert writer.write("s", "readings", 0, frame, schema, _checkpoint(tmp_path, "q")) == 3
    assert _table(pg, "SELECT device, reading, at, tags FROM latest_readings") == [
        ("d1", 3.5, _at(START + 3000), {"site": "y"}),
        ("d2", 2.0, _at(START + 2000), None),
    ]
    with connect(pg.postgres.effective_dsn) as conn:
        found = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = 'latest_readings'"
        ).fetchall()
    types = {str(row[0]): row[1] for row in found}
    assert types == {
        "device": "text",
        "reading": "double precision",
        "at": "timestamp with time zone",
        "tags": "jsonb",
    }


def test_the_embedded_server_runs_with_logical_replication_and_restarts_with_its_data(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    home = tmp_path_factory.mktemp("pg-cli")
    home.chmod(0o755)
    for parent in home.parents:
        if parent == Path("/tmp"):
            break
        parent.chmod(parent.stat().st_mode | 0o111)
    settings = load_settings(state_dir=home, postgres={"port": free_port()})
    env = {"KAPPAFLOW_POSTGRES__PORT": str(settings.postgres.port)}

    def cli(*args: str) -> Any:
        return run_kappaflow(settings, "postgres", *args, env=env)

    started = cli("start")
    try:
        assert started.code == 0, started.err
        assert f"postgres started on {settings.postgres.effective_dsn}" in started.err
        with connect(settings.postgres.effective_dsn) as conn:
            assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
            conn.execute("CREATE TABLE kept (n int)")
            conn.execute("INSERT INTO kept VALUES (7)")
        assert "already running" in cli("start").err
        status = json.loads(cli("status", "--json").out)
        assert status["state"] == "running"
        assert cli("stop").err.strip() == "postgres stopped"
        assert json.loads(cli("status", "--json").out)["state"] == "stopped"
        with pytest.raises(PostgresUnreachableError) as refused:
            connect(settings.postgres.effective_dsn, timeout_s=2)
        assert refused.value.code == "KF311"
        assert cli("start").code == 0
        with connect(settings.postgres.effective_dsn) as conn:
            assert conn.execute("SELECT n FROM kept").fetchall() == [(7,)]
    finally:
        cli("stop")


def test_no_server_to_run_is_said_with_what_to_install(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, postgres={"bin_dir": str(tmp_path / "none")})
    result = run_kappaflow(
        settings, "postgres", "start", env={"KAPPAFLOW_POSTGRES__BIN_DIR": str(tmp_path / "none")}
    )
    assert "holds no postgres and initdb" in error_line(result, "KF210", 1)


def test_an_external_server_is_not_managed(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path)
    dsn = "postgresql://u:secret@db.example:5432/x"
    result = run_kappaflow(settings, "postgres", "start", env={"KAPPAFLOW_POSTGRES__DSN": dsn})
    error_line(result, "KF305", 1)
    listed = run_kappaflow(settings, "status", "--json", env={"KAPPAFLOW_POSTGRES__DSN": dsn})
    rows = [json.loads(line) for line in listed.out.splitlines()]
    [row] = [r for r in rows if r["service"] == "postgres"]
    assert (row["state"], row["address"]) == ("external", "postgresql://u:***@db.example:5432/x")

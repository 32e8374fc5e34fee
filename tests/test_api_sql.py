"""SQL over the lake: ``POST /v1/sql``, ``GET /v1/sql/tables`` and ``kappaflow sql``.

The answers are checked against numbers computed from the service's test job's views
(tests/support/service.py), without the engine. The lock-down, the limits and the files
a query must not see are tested on a lake table written here by hand (a manifest and
Parquet files, as the lake writer lays them out), which needs no Spark.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import error_line, run_kappaflow
from service import VIEWS, Served, expected_windows, serve

from kappaflow.api.sql import lake_connection, run_sql
from kappaflow.jobs.files import PLAN
from kappaflow.jobs.manager import JobManager, JobRecord, JobState
from kappaflow.settings import Settings
from kappaflow.timeutil import parse_time, to_epoch_ms
from kappaflow.waiting import wait_for

# The service's test job.


def answer(client: httpx.Client, sql: str) -> dict[str, Any]:
    response = client.post("/v1/sql", json={"sql": sql})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_queries_answer_what_the_views_add_up_to(served: Served) -> None:
    job = served.job
    per_user = Counter(view["user"] for view in VIEWS)
    windows = expected_windows()
    latest_window = f"""
        SELECT page, epoch_ms(window_start) AS start, max_by(views, version) AS views
        FROM "{job}".pages GROUP BY ALL ORDER BY ALL"""
    with serve(served.settings) as client:
        # The lake table's batches may commit a moment after the serving store's.
        def complete() -> list[list[Any]] | None:
            rows: list[list[Any]] = answer(client, latest_window)["rows"]
            return rows if {(p, s): n for p, s, n in rows} == windows else None

        found = wait_for(complete, timeout=60, what="the lake's windows to hold every view")
        assert sum(n for _, _, n in found) == len(VIEWS)

        asked = time.monotonic()
        users = answer(
            client,
            f'SELECT "user", max(views) AS views, bool_or(regular) AS regular, max("at") AS at'
            f' FROM "{job}".last_view GROUP BY "user" ORDER BY "user"',
        )
        wall_ms = (time.monotonic() - asked) * 1000
        assert users["columns"] == [
            {"name": "user", "type": "VARCHAR"},
            {"name": "views", "type": "BIGINT"},
            {"name": "regular", "type": "BOOLEAN"},
            {"name": "at", "type": "TIMESTAMP WITH TIME ZONE"},
        ]
        assert {u: n for u, n, _, _ in users["rows"]} == per_user
        assert {u: regular for u, _, regular, _ in users["rows"]} == {
            u: n >= 3 for u, n in per_user.items()
        }
        last_at = Counter[str]()
        for view in VIEWS:
            last_at[view["user"]] = max(last_at[view["user"]], to_epoch_ms(parse_time(view["at"])))
        assert all(at.endswith("Z") for _, _, _, at in users["rows"])
        assert {u: to_epoch_ms(parse_time(at)) for u, _, _, at in users["rows"]} == last_at
        assert users["row_count"] == 4 and users["truncated"] is False
        # The query's own time: some, and less than the request's around it.
        assert 0 < users["elapsed_ms"] < wall_ms

        tables = {t["table"]: t for t in client.get("/v1/sql/tables").json()["items"]}
        pages = tables[f"{job}.pages"]
        assert [c["name"] for c in pages["columns"]] == [
            "page",
            "window_start",
            "window_end",
            "views",
            "kind",
            "version",
        ]
        assert pages["location"].endswith(f"/{job}/pages") and pages["files"] >= 1
        assert tables[f"{job}.last_view"]["rows"] >= len(per_user)


def test_the_command(served: Served) -> None:
    job = served.job
    query = f'SELECT "user", max(views) AS views FROM "{job}".last_view GROUP BY 1 ORDER BY 1'
    result = run_kappaflow(served.settings, "sql", query, "--json", timeout=60)
    assert result.code == 0, result.err
    rows = [json.loads(line) for line in result.lines()]
    assert {r["user"]: r["views"] for r in rows} == Counter(v["user"] for v in VIEWS)

    shown = run_kappaflow(served.settings, "sql", "--tables", "--json", timeout=60)
    assert shown.code == 0, shown.err
    tables = {t["table"]: t for t in map(json.loads, shown.lines())}
    assert {"name": "window_start", "type": "TIMESTAMP WITH TIME ZONE"} in tables[f"{job}.pages"][
        "columns"
    ]

    wrong = run_kappaflow(served.settings, "sql", f'SELECT * FROM "{job}".nope', timeout=60)
    assert "does not exist" in error_line(wrong, "KF863", 1)
    error_line(run_kappaflow(served.settings, "sql", timeout=60), "KF001", 2)


# A lake table written by hand: committed files, and files no manifest lists.

ORDERS = [
    {"id": 1, "amount": 10.5, "at": datetime(2026, 11, 23, 10, 0, tzinfo=UTC), "region": "eu"},
    {"id": 2, "amount": 4.0, "at": datetime(2026, 11, 23, 10, 5, tzinfo=UTC), "region": "eu"},
    {"id": 3, "amount": 7.25, "at": datetime(2026, 11, 23, 11, 0, tzinfo=UTC), "region": "us"},
]
SPARK_SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": name, "type": kind, "nullable": True, "metadata": {}}
        for name, kind in [
            ("id", "long"),
            ("amount", "double"),
            ("at", "timestamp"),
            ("region", "string"),
        ]
    ],
}


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> str:
    """The rows without their partition column, as Spark writes a partition's file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = {
        "id": pa.array([r["id"] for r in rows], pa.int64()),
        "amount": pa.array([r["amount"] for r in rows], pa.float64()),
        "at": pa.array([r["at"] for r in rows], pa.timestamp("us", tz="UTC")),
    }
    pq.write_table(pa.table(columns), path)
    return str(path)


def write_lake_job(settings: Settings, job: str, tables: dict[str, bool]) -> Path:
    """A stopped job whose plan names lake tables; those marked True hold ORDERS in
    committed files, beside files of a crashed attempt and of staging."""
    home = JobManager(settings).job_dir(job)
    home.mkdir(parents=True)
    JobRecord(name=job, pipeline="shop:build", params={}, state=JobState.STOPPED).save(
        home / "job.json"
    )
    lake = Path(settings.lake_root) / job
    sinks = []
    for table, committed in tables.items():
        root = lake / table
        root.mkdir(parents=True)
        sinks.append({"parquet": table, "location": str(root), "partition_by": ["region"]})
        if not committed:
            continue
        files: list[dict[str, Any]] = []
        for region in ("eu", "us"):
            rows = [r for r in ORDERS if r["region"] == region]
            name = f"region={region}/b0-abc-part-0000{len(files)}.snappy.parquet"
            write_parquet(root / name, rows)
            files.append({"path": name, "rows": len(rows)})
        manifest = {
            "format": 1,
            "batch_id": 0,
            "rows": len(ORDERS),
            "files": files,
            "partition_by": ["region"],
            "schema": SPARK_SCHEMA,
        }
        (root / "_kappaflow" / "manifest").mkdir(parents=True)
        (root / "_kappaflow" / "manifest" / f"{0:020d}.json").write_text(json.dumps(manifest))
        extra = [{**ORDERS[0], "id": 99, "amount": 1000.0}]
        write_parquet(root / "region=eu" / "b1-def-part-00000.snappy.parquet", extra)
        write_parquet(root / "_staging" / "batch=2-0" / "region=eu" / "part-00000.parquet", extra)
    plan = {"job": job, "outputs": [{"name": "orders", "sinks": sinks}]}
    (home / PLAN).write_text(json.dumps(plan))
    return lake


@pytest.fixture(scope="module")
def shop(serving: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Settings of a state directory of their own, with short limits; the service needs
    the serving store to start."""
    limits = serving.api.model_copy(update={"sql_timeout_s": 1.0, "sql_max_rows": 5})
    state = tmp_path_factory.mktemp("sql-state")
    settings = serving.model_copy(update={"state_dir": state, "api": limits})
    write_lake_job(settings, "shop-1", {"orders": True, "returns": False})
    yield settings


@pytest.fixture(scope="module")
def client(shop: Settings) -> Iterator[httpx.Client]:
    with serve(shop) as service:
        yield service


def refused(client: httpx.Client, sql: str, code: str, status: int) -> str:
    response = client.post("/v1/sql", json={"sql": sql})
    assert (response.status_code, response.json()["code"]) == (status, code), response.text
    message: str = response.json()["error"]
    return message


def test_only_the_committed_rows_are_seen(client: httpx.Client) -> None:
    found = answer(
        client,
        'SELECT region, count(*) AS n, sum(amount) AS amount, max(id) AS last FROM "shop-1".orders'
        " GROUP BY region ORDER BY region",
    )
    assert found["rows"] == [["eu", 2, 14.5, 2], ["us", 1, 7.25, 3]]
    assert found["columns"][0] == {"name": "region", "type": "VARCHAR"}


def test_the_tables_are_listed(client: httpx.Client) -> None:
    items = {t["table"]: t for t in client.get("/v1/sql/tables").json()["items"]}
    orders = items["shop-1.orders"]
    assert orders["columns"] == [
        {"name": "id", "type": "BIGINT"},
        {"name": "amount", "type": "DOUBLE"},
        {"name": "at", "type": "TIMESTAMP WITH TIME ZONE"},
        {"name": "region", "type": "VARCHAR"},
    ]
    assert (orders["rows"], orders["files"], orders["partition_by"]) == (3, 2, ["region"])
    # A table without a committed batch is listed, without columns, and cannot be queried.
    assert items["shop-1.returns"]["columns"] == [] and items["shop-1.returns"]["rows"] == 0
    refused(client, 'SELECT * FROM "shop-1".returns', "KF863", 404)


def test_values_are_json(client: httpx.Client) -> None:
    found = answer(
        client,
        "SELECT TIMESTAMPTZ '2026-11-23 10:00:00.25+02' AS tz, TIMESTAMP '2026-11-23 10:00:00'"
        " AS naive, DATE '2026-11-23' AS day, 1.5 AS dec, 'nan'::DOUBLE AS nan,"
        " '\\x01\\x02'::BLOB AS blob, [1, 2] AS list, {'a': 1} AS struct, NULL AS nothing,"
        " INTERVAL 90 SECOND AS span, 170141183460469231731687303715884105727::HUGEINT AS big",
    )
    assert found["rows"] == [
        [
            "2026-11-23T08:00:00.250000Z",
            "2026-11-23T10:00:00Z",
            "2026-11-23",
            1.5,
            None,
            "AQI=",
            [1, 2],
            {"a": 1},
            None,
            "PT90S",
            170141183460469231731687303715884105727,
        ]
    ]
    first = answer(client, 'SELECT min("at") AS at FROM "shop-1".orders')
    assert first["rows"] == [["2026-11-23T10:00:00Z"]]


def test_at_most_max_rows_rows(client: httpx.Client) -> None:
    more = answer(client, "SELECT range AS n FROM range(12) ORDER BY n DESC")
    assert more["rows"] == [[11], [10], [9], [8], [7]]
    assert (more["row_count"], more["truncated"]) == (5, True)
    exact = answer(client, "SELECT * FROM range(5)")
    assert (exact["row_count"], exact["truncated"]) == (5, False)


def test_a_query_past_its_time_limit_is_stopped(client: httpx.Client) -> None:
    slow = "SELECT sum(a.range * b.range) FROM range(1000000) a, range(1000000) b"
    message = refused(client, slow, "KF864", 504)
    assert "limit of 1 s" in message


# Reading outside the lake, or anything but the committed files, and writing.


@pytest.mark.parametrize(
    ("sql", "code", "status"),
    [
        ("SELECT * FROM read_parquet('/etc/ssl/certs/ca.parquet')", "KF862", 403),
        ("SELECT * FROM read_csv('/etc/passwd')", "KF862", 403),
        ("SELECT * FROM read_text('/etc/passwd')", "KF862", 403),
        ("SELECT * FROM '/etc/passwd.csv'", "KF862", 403),
        ("SELECT * FROM glob('/etc/*')", "KF862", 403),
        ("SELECT * FROM read_parquet('https://example.com/x.parquet')", "KF862", 403),
        ("COPY (SELECT 1) TO '/tmp/kappaflow-sql-copy.csv'", "KF862", 403),
        ("ATTACH '/tmp/kappaflow-sql.db' AS other", "KF862", 403),
        ("INSTALL httpfs", "KF862", 403),
        ("LOAD httpfs", "KF862", 403),
        ("CREATE TABLE t (a INTEGER)", "KF862", 403),
        ("INSERT INTO \"shop-1\".orders VALUES (9, 1.0, now(), 'eu')", "KF862", 403),
        ('DROP VIEW "shop-1".orders', "KF862", 403),
        ("SET enable_external_access = true", "KF862", 403),
        ("PRAGMA enable_profiling", "KF862", 403),
        ("SELEC 1", "KF861", 400),
        ("SELECT 1; SELECT 2", "KF861", 400),
        ("", "KF861", 400),
        ('SELECT nope FROM "shop-1".orders', "KF861", 400),
        ("SELECT * FROM nope.orders", "KF863", 404),
        ("SELECT CAST('x' AS INTEGER)", "KF865", 422),
    ],
)
def test_refused(client: httpx.Client, sql: str, code: str, status: int) -> None:
    message = refused(client, sql, code, status)
    assert "\n" not in message


def test_files_in_the_lake_that_no_manifest_lists_cannot_be_read(
    client: httpx.Client, shop: Settings
) -> None:
    root = Path(shop.lake_root) / "shop-1" / "orders"
    uncommitted = [
        root / "region=eu" / "b1-def-part-00000.snappy.parquet",
        root / "_staging" / "batch=2-0" / "region=eu" / "part-00000.parquet",
    ]
    for path in uncommitted:
        assert path.exists()
        refused(client, f"SELECT * FROM read_parquet('{path}')", "KF862", 403)
    refused(client, f"SELECT * FROM read_parquet('{root}/**/*.parquet')", "KF862", 403)
    # Nor a committed one by its path: the views are the only way in.
    committed = root / "region=us" / "b0-abc-part-00001.snappy.parquet"
    refused(client, f"SELECT * FROM read_parquet('{committed}')", "KF862", 403)
    refused(client, f"SELECT * FROM read_json('{root}/_kappaflow/manifest/*.json')", "KF862", 403)


def test_the_connection_itself_is_locked(shop: Settings, tmp_path: Path) -> None:
    """Beneath the check that lets only SELECT through, the connection refuses on its own."""
    target = tmp_path / "out.csv"
    statements = [
        "SELECT * FROM read_csv('/etc/passwd')",
        f"COPY (SELECT 1) TO '{target}'",
        f"ATTACH '{tmp_path / 'other.db'}'",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "SET allowed_directories = ['/']",
        "SET autoload_known_extensions = true",
    ]
    with lake_connection(shop) as (con, tables):
        assert [t.qualified for t, _ in tables] == ['"shop-1"."orders"', '"shop-1"."returns"']
        for statement in statements:
            with pytest.raises(duckdb.Error):
                con.execute(statement)
        assert con.execute('SELECT count(*) FROM "shop-1".orders').fetchall() == [(3,)]
    assert not target.exists()


def test_limits_given_to_the_engine(shop: Settings) -> None:
    found = run_sql(shop, "SELECT * FROM range(3)", max_rows=2, timeout_s=5)
    assert (found.rows, found.truncated) == ([[0], [1]], True)


def test_the_command_prints_a_table_and_refuses_in_one_line(shop: Settings) -> None:
    shown = run_kappaflow(
        shop, "sql", 'SELECT region, count(*) AS orders FROM "shop-1".orders GROUP BY 1', timeout=60
    )
    assert shown.code == 0, shown.err
    assert shown.lines()[0].split() == ["region", "┃", "orders"]
    assert sorted(line.split()[::2] for line in shown.lines()[2:]) == [["eu", "2"], ["us", "1"]]
    wrong = run_kappaflow(shop, "sql", "SELECT * FROM read_csv('/etc/passwd')", timeout=60)
    assert "/etc/passwd" in error_line(wrong, "KF862", 1)
    both = run_kappaflow(shop, "sql", "SELECT 1", "--tables", timeout=60)
    error_line(both, "KF001", 2)

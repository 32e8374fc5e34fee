"""Change data capture against the real components: the Kafka Connect worker started,
asked and stopped by `kappaflow connect`, Debezium's PostgreSQL connector created by
`kappaflow connect create` on the embedded PostgreSQL, and a table's inserts, updates and
deletes reaching its topic as Debezium's envelopes, in order, through a restart of the
worker. The tests with a worker (15 s to start) are in the long tier.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
from conftest import Result, error_line, run_kappaflow
from pg_server import pg  # noqa: F401 (a fixture: see its uses)
from pyspark.sql import SparkSession

import kappaflow as kf
from kappaflow.kafka.connect import postgres_connector_config, worker_properties
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.postgresql.server import connect
from kappaflow.procs import free_port
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cdc(kafka: Settings, pg: Settings) -> Settings:  # noqa: F811
    """Kafka's settings with the embedded PostgreSQL and a Connect worker of this module."""
    group = f"connect-{uuid.uuid4().hex[:8]}"
    return kafka.model_copy(
        update={
            "postgres": pg.postgres,
            "connect": kafka.connect.model_copy(
                update={"port": free_port(), "group_id": group, "heap": "256m"}
            ),
        }
    )


def _env(settings: Settings) -> dict[str, str]:
    return {
        "KAPPAFLOW_CONNECT__PORT": str(settings.connect.port),
        "KAPPAFLOW_CONNECT__GROUP_ID": settings.connect.group_id,
        "KAPPAFLOW_CONNECT__HEAP": settings.connect.heap,
        "KAPPAFLOW_POSTGRES__PORT": str(settings.postgres.port),
    }


def _kf(settings: Settings, *args: str) -> Result:
    return run_kappaflow(settings, *args, env=_env(settings), timeout=300)


def _status(settings: Settings) -> dict[str, Any]:
    result = _kf(settings, "connect", "status", "--json")
    assert result.code == 0, result.err
    found: dict[str, Any] = json.loads(result.out)
    return found


@pytest.fixture(scope="module")
def worker(cdc: Settings) -> Iterator[Settings]:
    """The module's Connect worker, started by the CLI (and stopped by it after)."""
    assert _status(cdc)["state"] == "stopped"
    started = _kf(cdc, "connect", "start")
    try:
        assert started.code == 0, started.err
        assert f"connect started: {cdc.connect.url}" in started.err
        yield cdc
    finally:
        _kf(cdc, "connect", "stop")


def _envelopes(settings: Settings, topic: str, count: int) -> list[tuple[Any, Any]]:
    """The first ``count`` records of ``topic`` as (key, value) JSON, waiting for them."""

    def read() -> list[tuple[Any, Any]] | None:
        try:
            found = [
                (_json(m.key()), _json(m.value()))
                for m in read_records(settings.kafka, topic, start=StartAt(beginning=True))
            ]
        except Exception:  # the topic is created by the connector's first record
            return None
        return found if len(found) >= count else None

    return wait_for(read, timeout=120, interval=1.0, what=f"{count} records on {topic}")


def _json(raw: bytes | None) -> Any:
    return json.loads(raw) if raw else None


def _short(records: list[tuple[Any, Any]]) -> list[tuple[Any, ...]]:
    """(id, op, after's name or None) per envelope, ("tombstone", id) per tombstone."""
    out: list[tuple[Any, ...]] = []
    for key, value in records:
        if value is None:
            out.append(("tombstone", key["id"]))
        else:
            after = value["after"]
            out.append((key["id"], value["op"], after["name"] if after else None))
    return out


@pytest.mark.long
def test_the_worker_runs_once_and_says_its_state(worker: Settings) -> None:
    found = _status(worker)
    assert found["state"] == "running"
    assert found["url"] == worker.connect.url
    # `kappaflow status` lists it while it runs.
    listed = _kf(worker, "status", "--json")
    assert listed.code == 0, listed.err
    rows = {row["service"]: row for row in map(json.loads, listed.out.splitlines())}
    assert (rows["connect"]["state"], rows["connect"]["address"]) == ("running", worker.connect.url)
    again = _kf(worker, "connect", "start")
    assert again.code == 0, again.err
    assert "connect already running" in again.err


@pytest.mark.long
def test_rows_changed_in_postgres_reach_the_topic_in_order_through_a_worker_restart(
    worker: Settings,
) -> None:
    name = f"pg{uuid.uuid4().hex[:6]}"
    table = f"items_{name}"
    dsn = worker.postgres.effective_dsn
    with connect(dsn) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text NOT NULL)")
        conn.execute(f"INSERT INTO {table} VALUES (1, 'one')")
    created = _kf(worker, "connect", "create", name, "--postgres", dsn, "--tables", table)
    assert created.code == 0, created.err
    topic = f"{name}.public.{table}"
    assert f"connector {name} runs: {topic}" in created.err
    assert _status(worker)["connectors"][name] == {"state": "RUNNING", "tasks": ["RUNNING"]}
    with connect(dsn) as conn:
        conn.execute(f"INSERT INTO {table} VALUES (2, 'two')")
        conn.execute(f"UPDATE {table} SET name = 'uno' WHERE id = 1")
        conn.execute(f"DELETE FROM {table} WHERE id = 2")
    first = _envelopes(worker, topic, 5)
    assert _short(first) == [
        (1, "r", "one"),  # the snapshot
        (2, "c", "two"),
        (1, "u", "uno"),
        (2, "d", None),
        ("tombstone", 2),
    ]
    delete = first[3][1]
    # The row's key only (REPLICA IDENTITY DEFAULT): what a delete needs.
    assert delete["before"]["id"] == 2
    assert delete["source"]["table"] == table and delete["source"]["lsn"] > 0
    assert isinstance(delete["ts_ms"], int)

    # Changes made while the worker is down are captured once it is back, none twice.
    stopped = _kf(worker, "connect", "stop")
    assert stopped.code == 0 and "connect stopped" in stopped.err, stopped.err
    assert _status(worker)["state"] == "stopped"
    with connect(dsn) as conn:
        conn.execute(f"INSERT INTO {table} VALUES (3, 'three')")
        conn.execute(f"UPDATE {table} SET name = 'eins' WHERE id = 1")
    restarted = _kf(worker, "connect", "start")
    assert restarted.code == 0, restarted.err
    with connect(dsn) as conn:
        conn.execute(f"DELETE FROM {table} WHERE id = 3")
    everything = _envelopes(worker, topic, 9)
    assert _short(everything) == [
        *_short(first),
        (3, "c", "three"),
        (1, "u", "eins"),
        (3, "d", None),
        ("tombstone", 3),
    ]
    deleted = _kf(worker, "connect", "delete", name)
    assert deleted.code == 0 and f"connector {name} deleted" in deleted.err, deleted.err
    assert name not in _status(worker)["connectors"]


def test_a_connector_is_debeziums_postgres_connector_on_pgoutput_with_a_slot_of_its_own(
    cdc: Settings,
) -> None:
    config = postgres_connector_config(
        "shop-1", "postgresql://app:secret@db.example:6543/shop", ["orders", "audit.log"]
    )
    assert config["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert config["plugin.name"] == "pgoutput"
    assert config["slot.name"] == config["publication.name"] == "kf_shop_1"
    assert (config["database.hostname"], config["database.port"]) == ("db.example", "6543")
    assert (config["database.user"], config["database.password"]) == ("app", "secret")
    assert config["database.dbname"] == "shop"
    assert config["table.include.list"] == r"public\.orders,audit\.log"
    props = worker_properties(cdc, "/plugins")
    assert "exactly.once.source.support = enabled\n" in props
    assert f"config.storage.topic = {cdc.connect.group_id}-configs\n" in props
    assert "plugin.path = /plugins\n" in props


def test_a_worker_without_kafka_does_not_start(offline: Settings) -> None:
    result = run_kappaflow(
        offline, "connect", "start", env={"KAPPAFLOW_CONNECT__PORT": str(free_port())}
    )
    line = error_line(result, "KF424", 1)
    assert "does not answer" in line and "nothing was started" in line
    assert _status_of(offline) == "stopped"


def test_a_connector_needs_a_running_worker(offline: Settings) -> None:
    port = free_port()
    result = run_kappaflow(
        offline,
        "connect",
        "create",
        "orders",
        "--tables",
        "orders",
        env={"KAPPAFLOW_CONNECT__PORT": str(port)},
    )
    line = error_line(result, "KF425", 1)
    assert f"Kafka Connect at http://127.0.0.1:{port} does not answer" in line


def _status_of(settings: Settings) -> str:
    result = run_kappaflow(settings, "connect", "status", "--json")
    assert result.code == 0, result.err
    return str(json.loads(result.out)["state"])


@dataclass
class Sale:
    sku: str
    at: kf.EventTime


@dataclass
class Product:
    sku: str
    name: str
    price: str


def sales_named(job: kf.Job) -> None:
    products = job.changes("shop.public.products", Product, key="sku")
    job.source("sales", Sale, key="sku").join(products).to(kf.topic("named"))


def _change(op: str, before: Any, after: Any) -> kf.testing.Record:
    key = (after or before)["sku"]
    envelope = {
        "before": before,
        "after": after,
        "op": op,
        "ts_ms": 1_795_428_000_000,
        "source": {"table": "products", "lsn": 1},
    }
    return kf.testing.Record(envelope, key=json.dumps({"sku": key}))


def test_a_change_stream_is_a_table_its_deletes_and_tombstones_remove_rows(
    spark: SparkSession,
) -> None:
    pen = {"sku": "pen", "name": "Pen", "price": "1.50"}
    ink = {"sku": "ink", "name": "Ink", "price": "4.00"}
    cup = {"sku": "cup", "name": "Cup", "price": "3.00"}
    changes = [
        [
            _change("r", None, pen),
            _change("c", None, ink),
            _change("c", None, cup),
            _change("u", pen, {**pen, "price": "1.75"}),
            _change("d", {"sku": "ink", "name": "", "price": ""}, None),
            kf.testing.Record(None, key=json.dumps({"sku": "ink"})),  # the tombstone
            # Connect's schema beside the envelope: read as well.
            kf.testing.Record(
                {"schema": {}, "payload": {"before": cup, "after": {**cup, "name": "Mug"}}},
                key=json.dumps({"sku": "cup"}),
            ),
        ]
    ]
    sales = [
        [
            {"sku": "pen", "at": "2026-11-23T10:00:00Z"},
            {"sku": "ink", "at": "2026-11-23T10:00:01Z"},
            {"sku": "cup", "at": "2026-11-23T10:00:02Z"},
        ]
    ]
    out = kf.testing.run(
        sales_named, {"shop.public.products": changes, "sales": sales}, spark=spark
    )
    named = sorted(out.records("named"), key=lambda r: str(r["sku"]))
    assert named == [
        {"sku": "cup", "at": "2026-11-23T10:00:02.000Z", "name": "Mug", "price": "3.00"},
        # Deleted: a left join finds no row.
        {"sku": "ink", "at": "2026-11-23T10:00:01.000Z"},
        {"sku": "pen", "at": "2026-11-23T10:00:00.000Z", "name": "Pen", "price": "1.75"},
    ]
    assert out.dead_letters == []


@pytest.mark.long
def test_deleting_a_connector_drops_its_replication_slot_and_publication(
    worker: Settings,
) -> None:
    """An orphaned slot holds PostgreSQL's log forever: `connect delete` drops it, and the
    publication the connector created, once the connector's task has let go of it;
    `--keep-slot` keeps them."""
    dsn = worker.postgres.effective_dsn

    def slots_and_publications(ident: str) -> tuple[int, int]:
        with connect(dsn) as conn:
            slots = conn.execute(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (ident,)
            ).fetchone()
            publications = conn.execute(
                "SELECT count(*) FROM pg_publication WHERE pubname = %s", (ident,)
            ).fetchone()
        assert slots is not None and publications is not None
        return cast(int, slots[0]), cast(int, publications[0])

    for keep in (False, True):
        name = f"drop{uuid.uuid4().hex[:6]}"
        table = f"items_{name}"
        with connect(dsn) as conn:
            conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text NOT NULL)")
        created = _kf(worker, "connect", "create", name, "--postgres", dsn, "--tables", table)
        assert created.code == 0, created.err
        assert slots_and_publications(f"kf_{name}") == (1, 1)

        deleted = _kf(worker, "connect", "delete", name, *(["--keep-slot"] if keep else []))

        assert deleted.code == 0, deleted.err
        assert name not in _status(worker)["connectors"]
        if keep:
            assert deleted.err.strip().endswith(f"connector {name} deleted"), deleted.err
            assert slots_and_publications(f"kf_{name}") == (1, 1)
            with connect(dsn) as conn:  # not to leave it behind
                conn.execute("SELECT pg_drop_replication_slot(%s)", (f"kf_{name}",))
        else:
            dropped = f"dropped slot kf_{name} and publication kf_{name}"
            assert f"connector {name} deleted; {dropped}" in deleted.err, deleted.err
            assert slots_and_publications(f"kf_{name}") == (0, 0)


def changes_per_op(job: kf.Job) -> None:
    """Changes of the products table per operation and minute of commit time; and every
    change as it is, priced or not."""
    changes = job.change_stream("shop.public.products", Product, key="sku", watermark="0s")
    per_op = changes.window(tumbling="1m").aggregate("per_op", by="op", n=kf.count())
    per_op.to(kf.topic())
    changes.to(kf.topic("changes"), name="changes")


def _envelope(op: str, before: Any, after: Any, ts_ms: int, lsn: int) -> dict[str, Any]:
    return {
        "before": before,
        "after": after,
        "op": op,
        # When Debezium read it, later than the commit (the source's ts_ms).
        "ts_ms": ts_ms + 250,
        "source": {"table": "products", "lsn": lsn, "ts_ms": ts_ms},
    }


def test_a_change_stream_gives_each_change_as_an_event_with_op_time_and_lsn(
    spark: SparkSession,
) -> None:
    minute = 1_795_428_000_000  # 2026-11-23T10:00:00Z
    pen = {"sku": "pen", "name": "Pen", "price": "1.50"}
    ink = {"sku": "ink", "name": "Ink", "price": "4.00"}
    key = json.dumps({"sku": "pen"})
    changes = [
        [
            kf.testing.Record(_envelope("r", None, pen, minute + 1_000, 10), key=key),
            kf.testing.Record(_envelope("c", None, ink, minute + 2_000, 20), key=key),
            kf.testing.Record(
                _envelope("u", pen, {**pen, "price": "1.75"}, minute + 3_000, 30), key=key
            ),
            # A delete's before holds the key only (REPLICA IDENTITY DEFAULT).
            kf.testing.Record(
                _envelope(
                    "d", {"sku": "ink", "name": None, "price": None}, None, minute + 4_000, 40
                ),
                key=key,
            ),
            kf.testing.Record(None, key=key),  # the delete's tombstone: not a change
            # Connect's schema beside the envelope.
            kf.testing.Record(
                {"schema": {}, "payload": _envelope("c", None, pen, minute + 61_000, 50)}, key=key
            ),
            "not a change",
        ]
    ]
    out = kf.testing.run(changes_per_op, {"shop.public.products": [*changes]}, spark=spark)

    events = out.records("changes")
    assert [(e["op"], e["sku"], e.get("price"), e["lsn"], e["ts_ms"]) for e in events] == [
        ("r", "pen", "1.50", 10, "2026-11-23T10:00:01.000Z"),
        ("c", "ink", "4.00", 20, "2026-11-23T10:00:02.000Z"),
        ("u", "pen", "1.75", 30, "2026-11-23T10:00:03.000Z"),
        ("d", "ink", None, 40, "2026-11-23T10:00:04.000Z"),
        ("c", "pen", "1.50", 50, "2026-11-23T10:01:01.000Z"),
    ]
    counted = {}
    for change in sorted(out.changes("per_op"), key=lambda c: c["version"]):
        counted[(change["op"], change["window_start"][11:16])] = change["values"]["n"]
    assert counted == {
        ("r", "10:00"): 1,
        ("c", "10:00"): 1,
        ("u", "10:00"): 1,
        ("d", "10:00"): 1,
        ("c", "10:01"): 1,
    }
    [dead] = out.dead_letters
    assert dead["value"] == b"not a change"


def changes_of(job: kf.Job) -> None:
    changes = job.change_stream(job.param("topic"), Item, key="id", watermark="0s")
    changes.to(kf.topic(job.param("out")), name="changes")


@dataclass
class Item:
    id: int
    name: str


@pytest.mark.long
def test_a_change_stream_of_a_captured_table_on_the_real_components(
    worker: Settings, spark: SparkSession
) -> None:
    """Debezium's own envelopes, through a job's change stream: each insert, update and
    delete once, in commit order, with its commit time and its LSN."""
    from kappaflow.jobs.contract import JobContext
    from kappaflow.jobs.from_build import start_app

    name = f"cs{uuid.uuid4().hex[:6]}"
    table = f"items_{name}"
    dsn = worker.postgres.effective_dsn
    with connect(dsn) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text NOT NULL)")
        conn.execute(f"INSERT INTO {table} VALUES (1, 'one')")
    created = _kf(worker, "connect", "create", name, "--postgres", dsn, "--tables", table)
    assert created.code == 0, created.err
    with connect(dsn) as conn:
        conn.execute(f"INSERT INTO {table} VALUES (2, 'two')")
        conn.execute(f"UPDATE {table} SET name = 'uno' WHERE id = 1")
        conn.execute(f"DELETE FROM {table} WHERE id = 2")
    topic, out = f"{name}.public.{table}", f"{name}-changes"
    _envelopes(worker, topic, 5)
    params = {"topic": topic, "out": out}
    queries = start_app(changes_of, JobContext(f"job-{name}", params, spark, worker))
    try:
        # The job's topic has several partitions: the snapshot's row, then the changes in
        # commit order, by LSN (a snapshot's LSN is where the snapshot was read).
        found = _envelopes(worker, out, 4)
        events = sorted((v for _, v in found), key=lambda e: (e["op"] != "r", e["lsn"]))
    finally:
        for query in queries:
            query.stop()
        _kf(worker, "connect", "delete", name)
    assert [(e["op"], e["id"], e.get("name")) for e in events] == [
        ("r", 1, "one"),
        ("c", 2, "two"),
        ("u", 1, "uno"),
        # The delete's before: the key, and Debezium's placeholder for a NOT NULL column.
        ("d", 2, ""),
    ]
    lsns = [e["lsn"] for e in events]
    assert all(isinstance(n, int) and n > 0 for n in lsns) and len(set(lsns[1:])) == 3
    times = [e["ts_ms"] for e in events]
    assert all(t.endswith("Z") for t in times) and times[1:] == sorted(times[1:])

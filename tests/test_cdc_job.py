"""Change data capture end to end, against the real components: rows inserted, updated and
deleted in PostgreSQL reach a running job (examples/priced_sales.py, a stream of sales
joined with ``job.changes``) through Debezium and a Kafka Connect worker, each sale
priced as the product's row stood when it was sent, through a restart of the worker (a
change made while it was down included) and a SIGKILL of the job's driver; every sale
is output once. (A file of its own: minutes, and the suite's workers take whole files.)"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import RunCli
from live_jobs import send_json, stop_if_running, topic_values, wait_job
from pg_server import pg  # noqa: F401 (a fixture: see its use)

from kappaflow.jobs.manager import JobManager
from kappaflow.kafka.connect import ConnectWorker
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.postgresql.server import connect
from kappaflow.procs import free_port
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for
from test_app_jobs import PATH

pytestmark = pytest.mark.long


@pytest.fixture
def worker(serving: Settings, pg: Settings, tmp_path: Path) -> Iterator[ConnectWorker]:  # noqa: F811
    """A Connect worker of this test (its own folder, port and group), running."""
    settings = serving.model_copy(
        update={
            "state_dir": tmp_path / "cdc",
            "postgres": pg.postgres,
            "connect": serving.connect.model_copy(
                update={
                    "port": free_port(),
                    "group_id": f"connect-{uuid.uuid4().hex[:8]}",
                    "heap": "256m",
                }
            ),
        }
    )
    found = ConnectWorker(settings)
    assert found.start()
    try:
        yield found
    finally:
        found.stop()


@pytest.fixture
def job_name(serving: Settings) -> Iterator[str]:
    name = f"cdc-{uuid.uuid4().hex[:8]}"
    yield name
    stop_if_running(serving, name)


def _changes_on(settings: Settings, topic: str) -> int:
    try:
        return sum(1 for _ in read_records(settings.kafka, topic, start=StartAt(beginning=True)))
    except Exception:  # the connector creates the topic with its first record
        return 0


def test_a_jobs_output_follows_the_tables_changes_through_a_worker_restart_and_a_sigkill(
    cli: RunCli,
    serving: Settings,
    worker: ConnectWorker,
    job_name: str,
) -> None:
    dsn = worker.settings.postgres.effective_dsn
    table = f"products_{job_name.replace('-', '_')}"
    name = f"shop{uuid.uuid4().hex[:6]}"
    products = f"{name}.public.{table}"
    sales, priced = f"sales-{job_name}", f"priced-{job_name}"
    with connect(dsn) as conn:
        conn.execute(f"CREATE TABLE {table} (sku text PRIMARY KEY, name text, price numeric)")
        conn.execute(f"INSERT INTO {table} VALUES ('tea', 'Tea', 1.00)")
    worker.create_postgres(name, dsn, [table])
    cli("topics", "create", sales)
    changes = 1

    def changed(sql: str, records: int = 1) -> None:
        """Run ``sql`` in PostgreSQL and wait until its change records are in Kafka."""
        nonlocal changes
        with connect(dsn) as conn:
            conn.execute(sql)
        changes += records
        wait_for(
            lambda: True if _changes_on(serving, products) >= changes else None,
            timeout=120,
            interval=0.5,
            what=f"{changes} change records on {products}",
        )

    def start_job() -> None:
        params = ["-P", f"products={products}", "-P", f"sales={sales}", "-P", f"priced={priced}"]
        result = cli(
            "jobs",
            "start",
            job_name,
            "--app",
            "priced_sales:build",
            *params,
            env={"PYTHONPATH": PATH},
        )
        assert result.code == 0, result.err

    def sell(sale: str, count: int) -> list[dict[str, Any]]:
        send_json(
            serving,
            sales,
            [{"sale_id": sale, "sku": "tea", "at": "2026-11-23T10:00:00Z"}],
            key="sku",
        )
        return wait_job(
            serving,
            job_name,
            lambda: found if len(found := topic_values(serving, priced)) >= count else None,
            what=f"{count} priced sales",
        )

    wait_for(
        lambda: True if _changes_on(serving, products) >= 1 else None,
        timeout=120,
        what="the snapshot's record",
    )
    start_job()
    sell("s1", 1)
    changed(f"UPDATE {table} SET price = 2.00 WHERE sku = 'tea'")

    # The job's driver killed; started again, it goes on from its checkpoint.
    driver = JobManager(serving).get(job_name).pid
    assert driver is not None
    os.kill(driver, signal.SIGKILL)
    wait_for(
        lambda: True if JobManager(serving).get_state(job_name) == "crashed" else None,
        timeout=60,
        what="the job to be seen crashed",
    )
    start_job()
    sell("s2", 2)

    # A change made while the worker is down is captured once it is back.
    assert worker.stop()
    with connect(dsn) as conn:
        conn.execute(f"UPDATE {table} SET price = 3.00 WHERE sku = 'tea'")
    assert worker.start()
    changes += 1
    wait_for(
        lambda: True if _changes_on(serving, products) >= changes else None,
        timeout=120,
        interval=0.5,
        what="the change made while the worker was down",
    )
    sell("s3", 3)
    changed(f"DELETE FROM {table} WHERE sku = 'tea'", records=2)  # the delete, its tombstone
    out = sell("s4", 4)

    assert [(r["sale_id"], r.get("price")) for r in out] == [
        ("s1", "1.00"),
        ("s2", "2.00"),
        ("s3", "3.00"),
        ("s4", None),
    ]
    # Nothing captured twice through the restart: one record per change.
    assert _changes_on(serving, products) == changes == 5

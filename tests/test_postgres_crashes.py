"""The PostgreSQL sink through SIGKILLs, against an oracle: orders out of order, sent
twice, some late enough to correct a minute already final, the driver killed after the
tables' writes (before the batch's marker in Kafka) and before them; the tables then hold
exactly what the orders say, computed here without the engine. (A file of its own: the
test runs for minutes, and the suite's workers take whole files.)"""

from __future__ import annotations

import itertools
import json
import random
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import RunCli
from faults import CRASH_AT, CRASH_RECORD
from live_jobs import send_json, stop_if_running, wait_job
from pg_server import pg  # noqa: F401 (a fixture: see its use)

from kappaflow.jobs.manager import JobManager
from kappaflow.postgresql.server import connect
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for
from test_app_jobs import PATH, order

pytestmark = pytest.mark.long

#: Where the driver dies: after the tables' writes (their transactions committed, the
#: batch's marker in Kafka not), and after the serving store's step (before them).
CRASH_STEPS = ["after-lake", "after-store"]
BASE = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)


@pytest.fixture
def job_name(serving: Settings) -> Iterator[str]:
    name = f"rt-{uuid.uuid4().hex[:8]}"
    yield name
    stop_if_running(serving, name)


def _orders(seed: int) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Bursts of orders over four minutes, shuffled, with duplicates; and the distinct
    orders. Every order is within the allowed lateness (5 minutes) of the latest before
    it: none is too late, and one older than the watermark corrects its minute."""
    rng = random.Random(seed)
    distinct = [
        order(
            f"o{i}",
            rng.choice(["ada", "bob", "cy", "dee", "eve"]),
            rng.choice(["DE", "FR", "IT"]),
            rng.choice([0.5, 1.0, 2.5, 4.0, 10.0, -1.0]),  # a refund is not revenue
            (BASE + timedelta(seconds=rng.randrange(0, 240))).isoformat().replace("+00:00", "Z"),
        )
        for i in range(120)
    ]
    sent = distinct + rng.sample(distinct, 30)  # each of 30 sent twice
    rng.shuffle(sent)
    bursts = [sent[i : i + 30] for i in range(0, len(sent), 30)]
    # The last burst: late orders for the first minute, after the watermark passed it.
    late = [
        order(f"late{i}", "fay", "DE", 3.0, (BASE + timedelta(seconds=5 + i)).isoformat())
        for i in range(3)
    ]
    late = [{**o, "at": o["at"].replace("+00:00", "Z")} for o in late]
    return [*bursts, late], distinct + late


def _expected(orders: list[dict[str, Any]]) -> dict[tuple[str, datetime], tuple[float, int]]:
    totals: dict[tuple[str, datetime], list[float]] = defaultdict(list)
    for o in orders:
        if o["amount"] > 0:
            at = datetime.fromisoformat(o["at"].replace("Z", "+00:00"))
            minute = at.replace(second=0, microsecond=0)
            totals[(o["country"], minute)].append(o["amount"])
    return {k: (sum(v), len(v)) for k, v in totals.items()}


def _start(cli: RunCli, job: str, topic: str, dsn: str, crash: str | None, record: Path) -> None:
    reference = (
        ["--pipeline", "faults:REVENUE_TABLE_WITH_CRASH"]
        if crash
        else ["--app", "revenue_table:build"]
    )
    env = {
        "PYTHONPATH": PATH,
        CRASH_AT: crash or "",
        CRASH_RECORD: str(record),
        "KAPPAFLOW_POSTGRES__DSN": dsn,
    }
    params = ["-P", f"topic={topic}", "-P", f"table={job.replace('-', '_')}_rev"]
    params += ["-P", f"last={job.replace('-', '_')}_last"]
    result = cli("jobs", "start", job, *reference, *params, env=env)
    assert result.code == 0, result.err


def test_the_tables_hold_what_the_orders_say_through_crashes(
    cli: RunCli,
    serving: Settings,
    pg: Settings,  # noqa: F811
    new_topic: Callable[..., str],
    job_name: str,
    tmp_path: Path,
) -> None:
    dsn = pg.postgres.effective_dsn
    topic = new_topic(partitions=2)
    bursts, orders = _orders(seed=39)
    record = tmp_path / "crash.json"
    jobs = JobManager(serving)
    # A burst, a crash in its batch; a start that runs that batch again (its tables'
    # partitions committed or not) and crashes at the next step in the next burst's
    # batch; the last start has no fault.
    _start(cli, job_name, topic, dsn, f"{CRASH_STEPS[0]}:0", record)
    sending = iter(bursts)
    send_json(serving, topic, next(sending), key="buyer")
    for step, following in itertools.pairwise([*CRASH_STEPS, None]):
        wait_for(
            lambda: True if jobs.get_state(job_name) == "crashed" else None,
            timeout=240,
            what=f"the crash at {step}",
        )
        crashed = json.loads(record.read_text())
        assert crashed["step"] == step
        crash = f"{following}:{crashed['batch'] + 1}" if following else None
        _start(cli, job_name, topic, dsn, crash, record)
        send_json(serving, topic, next(sending), key="buyer")
    for burst in sending:
        send_json(serving, topic, burst, key="buyer")
    expected = _expected(orders)
    table = f"{job_name.replace('-', '_')}_rev"
    last = f"{job_name.replace('-', '_')}_last"

    def rows() -> dict[Any, Any] | None:
        with connect(dsn) as conn:
            exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
            if exists is None or exists[0] is None:
                return None
            found = conn.execute(f"SELECT country, window_start, total, orders FROM {table}")
            held: dict[Any, Any] = {(c, w): (t, n) for c, w, t, n in found.fetchall()}
            # The other output's query writes the last orders on its own time.
            buyers = conn.execute(f"SELECT count(*) FROM {last} WHERE buyer = 'fay'").fetchone()
        return held if held == expected and buyers == (1,) else None

    def failed() -> str:
        with connect(dsn) as conn:
            found = conn.execute(f"SELECT country, window_start, total, orders FROM {table}")
            held = {(c, w): (t, n) for c, w, t, n in found.fetchall()}
        return f"the table holds {held}, the orders say {expected}"

    try:
        wait_job(serving, job_name, rows, what="the revenue table to match", timeout=300)
    except TimeoutError:
        pytest.fail(failed())
    with connect(dsn) as conn:
        late_minute = conn.execute(
            f"SELECT kind, final FROM {table} WHERE country = 'DE' AND window_start = %s",
            (BASE,),
        ).fetchone()
        buyers = {row[0] for row in conn.execute(f"SELECT buyer FROM {last}")}
    # The late orders corrected a minute the watermark had made final.
    assert late_minute == ("correction", True)
    assert buyers == {o["buyer"] for o in orders}

"""Rescaling a job through a savepoint (jobs/rescale.py), for real: a windowed job with
disorder, duplicates, corrections and late events runs part of its stream at 4 shuffle
partitions, is rescaled to 2 by `kappaflow jobs rescale`, and runs the rest; its topic's
windows, its serving store, its lake table and its accounting must equal an oracle
computed here, as if it had never been rescaled. The job runs in this process on the
tests' Spark session (each phase reads what its topic holds, then stops), and the
commands run in this process too; the refusals are checked on the same job."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import Result, error_line, settings_env
from live_jobs import send_json, topic_values
from pyspark.sql import SparkSession

import kappaflow.cli
from kappaflow.jobs.contract import JobContext
from kappaflow.jobs.from_build import start_app
from kappaflow.jobs.manager import JobManager, JobRecord, JobState
from kappaflow.jobs.pipeline import load_build
from kappaflow.jobs.rescale import query_partitions
from kappaflow.jobs.restore import check
from kappaflow.jobs.status import outputs_status
from kappaflow.settings import Settings
from kappaflow.streams.output.lake_read import read_arrow

APP = "rescale_jobs:build"
COUNTRIES = ["DE", "FR", "IT", "ES", "NL", "PL", "SE", "AT"]
T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
SHUFFLE = "spark.sql.shuffle.partitions"
COUNTS = ("events", "duplicates", "late")


def order(oid: str, country: str, amount: float, second: int) -> dict[str, Any]:
    at = (T0 + timedelta(seconds=second)).isoformat().replace("+00:00", "Z")
    return {"order_id": oid, "country": country, "amount": amount, "at": at}


def rounds() -> list[list[dict[str, Any]]]:
    """Four rounds, each read by a run of its own: two before the rescale, two after.
    Watermark 10 s behind the latest event, corrections for a minute after a window ends."""
    a = [
        order(f"a-{c}-{j}", c, float(i + 1) * m, s)
        for i, c in enumerate(COUNTRIES)
        for j, (m, s) in enumerate([(1.0, 40), (2.0, 5), (0.5, 30)])  # out of order
    ]
    a.append(dict(a[0]))  # a duplicate in the same batch
    b = [order(f"b-{c}-1", c, 3.0, 70) for c in COUNTRIES]
    b += [order(f"b-{c}-0", c, 1.5, 20) for c in COUNTRIES[::2]]  # behind, window still open
    b += [order("b-DE-2", "DE", 1.0, 90), dict(a[4])]  # watermark 10:01:20; a duplicate
    # After the rescale: corrections of the final 10:00 window, duplicates of ids the job
    # saw before the rescale (its state must still hold them), the 10:01 window made final.
    c = [order(f"c-{x}-0", x, 7.0, 55) for x in COUNTRIES[1:5]]
    c += [dict(a[6]), dict(b[3])]
    c += [order(f"c-{x}-1", x, 2.5, 100) for x in COUNTRIES]
    c += [order("c-DE-2", "DE", 4.0, 160)]  # watermark 10:02:30: 10:00 is forgotten
    d = [order("d-DE-late", "DE", 99.0, 10)]  # too late: to the late topic
    d += [order(f"d-{x}-1", x, 0.25, 115) for x in COUNTRIES[5:]]  # corrections of 10:01
    d += [dict(c[8]), order("d-SE-4", "SE", 1.0, 250)]  # a duplicate; watermark 10:04:00
    return [a, b, c, d]


LATE = {"d-DE-late"}


def window_iso(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def oracle(sent: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Each (country, window start)'s final values: every order once, the late one out."""
    seen: set[str] = set()
    found: dict[tuple[str, str], dict[str, Any]] = defaultdict(lambda: {"total": 0.0, "n": 0})
    for o in sent:
        if o["order_id"] in seen or o["order_id"] in LATE:
            continue
        seen.add(o["order_id"])
        at = datetime.fromisoformat(o["at"])
        start = at.replace(second=0).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        found[(o["country"], start)]["total"] += o["amount"]
        found[(o["country"], start)]["n"] += 1
    return dict(found)


def in_process(monkeypatch: pytest.MonkeyPatch, settings: Settings, *args: str) -> Result:
    """The `kappaflow` command in this process (on the tests' Spark session)."""
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = kappaflow.cli.main(list(args))
    return Result(code, out.getvalue(), err.getvalue())


def run_phase(spark: SparkSession, settings: Settings, name: str, topic: str) -> None:
    """The job reads what its topic holds, then stops."""
    ctx = JobContext(name, {"topic": topic}, spark, settings)
    queries = start_app(load_build(APP), ctx, available_now=True)
    try:
        for query in queries:
            assert query.awaitTermination(180), f"{query.name} did not end within 180 s"
    finally:
        for query in queries:
            query.stop()


@pytest.fixture
def job(serving: Settings, new_topic: Callable[..., str]) -> Iterator[tuple[str, str]]:
    name = f"rescale-{uuid.uuid4().hex[:8]}"
    topic = new_topic(partitions=2)
    home = JobManager(serving).job_dir(name)
    home.mkdir(parents=True)
    JobRecord(name, APP, {"topic": topic}, state=JobState.STOPPED).save(home / "job.json")
    yield name, topic


# Four runs of the job and a rescale: about 90 s on a busy two-core machine.
@pytest.mark.long
def test_a_job_rescaled_from_4_to_2_partitions_gives_the_oracles_results(
    serving: Settings,
    spark: SparkSession,
    job: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name, topic = job
    query = Path(serving.checkpoint_location) / name / "revenue"
    a, b, c, d = rounds()
    before = spark.conf.get(SHUFFLE)
    spark.conf.set(SHUFFLE, "4")
    try:
        for batch in (a, b):
            send_json(serving, topic, batch, key="country")
            run_phase(spark, serving, name, topic)
        assert query_partitions(query) == 4

        done = in_process(monkeypatch, serving, "jobs", "rescale", name, "--partitions", "2")
        assert done.code == 0, done.err
        assert "revenue 4 -> 2" in done.err, done.err
        assert query_partitions(query) == 2
        [label] = [p.name for p in (JobManager(serving).job_dir(name) / "savepoints").iterdir()]
        assert label.startswith("rescale-")
        saved = JobManager(serving).job_dir(name) / "savepoints" / label / "checkpoint"
        assert query_partitions(saved / "revenue") == 4, "the savepoint keeps the job as it was"
        manifest = json.loads((saved.parent / "manifest.json").read_text())
        assert manifest["outputs"]["revenue"]["partitions"] == 4

        # The session still asks for 4: the checkpoint's 2 are what the job runs with.
        for batch in (c, d):
            send_json(serving, topic, batch, key="country")
            run_phase(spark, serving, name, topic)
        assert query_partitions(query) == 2
    finally:
        spark.conf.set(SHUFFLE, before or "2")

    sent = [*a, *b, *c, *d]
    expected = oracle(sent)
    # The topic: each window's changes numbered from 1 without a gap, each naming the one
    # before; its last change the oracle's; one `final` for each window made final.
    changes = topic_values(serving, f"{name}.revenue")
    history: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for change in changes:
        history[(change["country"], change["window_start"])].append(change)
    assert {k: v[-1]["values"] for k, v in history.items()} == expected
    for window, versions in history.items():
        assert [v["version"] for v in versions] == list(range(1, len(versions) + 1)), window
        for earlier, later in itertools.pairwise(versions):
            assert later["previous"] == earlier["values"], window
        if window[1] in ("2026-11-23T10:00:00.000Z", "2026-11-23T10:01:00.000Z"):
            kinds = [v["kind"] for v in versions]
            assert kinds.count("final") == 1, (window, kinds)
    corrected = {k for k, v in history.items() if any(x["kind"] == "correction" for x in v)}
    assert corrected == {(x, "2026-11-23T10:00:00.000Z") for x in COUNTRIES[1:5]} | {
        (x, "2026-11-23T10:01:00.000Z") for x in COUNTRIES[5:]
    }

    # The serving store and the lake hold the same.
    store = redis.Redis.from_url(serving.redis.effective_url)
    held = {
        (json.loads(key.decode().rsplit(":w:", 1)[1])[0], window_iso(int(start))): (
            json.loads(value)["values"]
        )
        for key in store.scan_iter(f"kf:{name}:revenue:w:*")
        for start, value in store.hgetall(key).items()
    }
    assert held == expected
    lake = read_arrow(f"{serving.lake_root}/{name}/revenue").to_pylist()
    assert sorted((r["country"], r["version"], r["total"]) for r in lake) == sorted(
        (x["country"], x["version"], x["values"]["total"]) for x in changes
    ), "the lake holds each change once, as the topic does"

    # Accounting: every record read once, passed, a duplicate or late.
    [late] = topic_values(serving, f"{name}.late", at_least=1)
    assert json.loads(late["event"])["order_id"] == "d-DE-late"
    counted = [int(store.hget(f"kf:{name}:revenue:stats", k) or -1) for k in COUNTS]
    assert tuple(counted) == (
        sum(v["n"] for v in expected.values()),
        5,
        1,
    )
    status = outputs_status(serving, name)["revenue"]
    assert status["events_read"] == len(sent)
    assert status["partitions"] == 2

    # The plan is the job's: a start from the savepoint before the rescale is taken.
    check(serving, name, APP, {"topic": topic}, label, spark=spark)


def test_rescales_that_cannot_be_are_refused_with_nothing_changed(
    serving: Settings,
    spark: SparkSession,
    job: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    name, topic = job
    jobs = JobManager(serving)

    def rescale(*args: str) -> Result:
        return in_process(monkeypatch, serving, "jobs", "rescale", name, *args)

    send_json(serving, topic, rounds()[0], key="country")
    run_phase(spark, serving, name, topic)  # at the session's 2 partitions
    query = Path(serving.checkpoint_location) / name / "revenue"
    assert query_partitions(query) == 2
    assert "already has 2 partitions" in error_line(rescale("--partitions", "2"), "KF912", 1)
    assert "1 or more" in error_line(rescale("--partitions", "0"), "KF911", 2)

    # The last batch planned, not committed: Spark would skip it.
    commits = sorted((query / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last = commits[-1]
    last.rename(tmp_path / "commit")
    try:
        assert f"batch {last.name} did not finish" in error_line(
            rescale("--partitions", "3"), "KF914", 1
        )
    finally:
        (tmp_path / "commit").rename(last)

    # A running driver (a stand-in with the job's mark) without --restart.
    home = jobs.job_dir(name)
    stand_in = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", f"--kappaflow-job={home}"],
        stdin=subprocess.PIPE,
    )
    try:
        (home / "driver.pid").write_text(f"{stand_in.pid}\n")
        assert "is running" in error_line(rescale("--partitions", "3"), "KF910", 1)
    finally:
        assert stand_in.stdin is not None
        stand_in.stdin.close()
        stand_in.wait(30)
        (home / "driver.pid").unlink()

    record = jobs.get(name)
    record.real_time = True
    record.save(home / "job.json")
    assert "real-time" in error_line(rescale("--partitions", "3"), "KF913", 1)

    # Nothing was changed: no savepoint, the checkpoint's 2 partitions.
    assert not (home / "savepoints").exists()
    assert query_partitions(query) == 2

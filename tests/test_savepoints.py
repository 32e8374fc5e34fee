"""Savepoints of a job on the job API (jobs/savepoints.py), for real.

One job (tests/support/savepoint_jobs.py), started by `jobs start` on the broker, Redis
and the lake, has a savepoint taken while it runs (its driver pauses its queries) and one
once stopped. It starts from the stopped one with a filter added, its checkpoint moved
elsewhere, then from the running one unchanged, its sinks by then past that savepoint;
every result must be exact. Changes its state cannot take, and savepoints that are missing, damaged
or another job's, are refused with nothing changed. The commands the tests only expect a
refusal from run in this process (`kappaflow.cli.main`), on the tests' Spark session.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import REPO, Result, error_line, run_kappaflow, settings_env
from live_jobs import send_json, stop_if_running, topic_values, wait_job
from pyspark.sql import SparkSession

import kappaflow.cli
from kappaflow.errors import TopicNotFoundError
from kappaflow.jobs.contract import JobContext
from kappaflow.jobs.from_build import start_app
from kappaflow.jobs.manager import JobManager, JobRecord, JobState
from kappaflow.jobs.pipeline import load_build
from kappaflow.jobs.restore import Change, compare_plans, restore
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.kafka.topics import create_topic, describe_topic
from kappaflow.settings import Settings
from kappaflow.streams.output.lake_read import read_arrow

# The module's job is started, stopped and saved by four commands of up to 360 s each,
# charged to its first test: pytest's timeout must not cut them short.
pytestmark = [pytest.mark.long, pytest.mark.timeout(1800)]

ENV = {
    "PYTHONPATH": os.pathsep.join(
        [str(REPO / "tests" / "support"), os.environ.get("PYTHONPATH", "")]
    )
}


def order(oid: str, country: str, amount: float, second: int) -> dict[str, Any]:
    at = f"2026-11-23T10:00:{second:02d}Z"
    return {"order_id": oid, "buyer": f"b-{oid}", "country": country, "amount": amount, "at": at}


# Sent while the job runs, before its running savepoint (A) and before it stops (B); after
# both (C).
ROUND_A = [order("a1", "DE", 10.0, 1), order("a2", "FR", 5.0, 2), order("a3", "DE", 2.0, 3)]
ROUND_B = [order("b1", "DE", 1.0, 4), order("b2", "FR", 7.0, 5)]
ROUND_C = [order("c1", "DE", 4.0, 6), order("c2", "FR", 3.0, 7), order("c3", "DE", 0.5, 8)]


@dataclass(frozen=True)
class Deployed:
    name: str
    topic: str

    @property
    def params(self) -> dict[str, str]:
        return {"topic": self.topic}

    def app(self, version: str) -> tuple[str, ...]:
        return ("--app", f"savepoint_jobs:{version}", "-P", f"topic={self.topic}")


def events(settings: Settings, name: str) -> int:
    store = redis.Redis.from_url(settings.redis.effective_url)
    return int(store.hget(f"kf:{name}:revenue:stats", "events") or 0)


def wait_events(settings: Settings, name: str, n: int) -> None:
    wait_job(
        settings,
        name,
        lambda: True if events(settings, name) >= n else None,
        what=f"{name} to count {n} events",
    )


@pytest.fixture(scope="module")
def deployed(serving: Settings) -> Iterator[Deployed]:
    """The job, run by its driver: a savepoint `live` taken while it runs, `before` once it
    stopped."""
    job = Deployed(f"sp-{uuid.uuid4().hex[:8]}", f"sp-orders-{uuid.uuid4().hex[:8]}")
    create_topic(serving.kafka, job.topic, partitions=1)

    def run(*args: str) -> None:
        result = run_kappaflow(serving, *args, env=ENV, timeout=360)
        assert result.code == 0, result.err

    try:
        run("jobs", "start", job.name, *job.app("build"))
        send_json(serving, job.topic, ROUND_A, key="buyer")
        wait_events(serving, job.name, 3)
        run("jobs", "savepoint", job.name, "--as", "live")
        send_json(serving, job.topic, ROUND_B, key="buyer")
        wait_events(serving, job.name, 5)  # its queries went on after the savepoint
        run("jobs", "stop", job.name)
        run("jobs", "savepoint", job.name, "--as", "before")
        yield job
    finally:
        stop_if_running(serving, job.name)


def in_process(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    settings: Settings,
    *args: str,
) -> Result:
    """The `kappaflow` command in this process, on the tests' Spark session if it builds
    one."""
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    code = kappaflow.cli.main(list(args))
    out = capsys.readouterr()
    return Result(code, out.out, out.err)


def savepoint_dir(settings: Settings, name: str, label: str) -> Path:
    return JobManager(settings).job_dir(name) / "savepoints" / label


def manifest(settings: Settings, name: str, label: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        (savepoint_dir(settings, name, label) / "manifest.json").read_text()
    )
    return found


# What the job's sinks hold.


def stored(settings: Settings, name: str) -> dict[str, dict[str, Any]]:
    """The serving store's values per country (one window: 10:00)."""
    store = redis.Redis.from_url(settings.redis.effective_url)
    found = {}
    for member in store.smembers(f"kf:{name}:revenue:keys"):
        key = member.decode() if isinstance(member, bytes) else str(member)
        [window] = store.hgetall(f"kf:{name}:revenue:w:{key}").values()
        found[json.loads(key)[0]] = json.loads(window)["values"]
    return found


def lake_latest(settings: Settings, name: str) -> dict[str, dict[str, Any]]:
    """The lake's last version per country, and every batch it holds once."""
    rows = read_arrow(f"{settings.lake_root}/{name}/revenue").to_pylist()
    latest: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: r["version"]):
        latest[row["country"]] = {"total": row["total"], "n": row["n"]}
    versions = [(r["country"], r["version"]) for r in rows]
    assert len(versions) == len(set(versions)), f"a change is in the lake twice: {versions}"
    return latest


def kafka_latest(settings: Settings, name: str) -> dict[str, dict[str, Any]]:
    """The topic's last change per country: the records of a batch published again
    (after a start from a savepoint) come after those of the batch they replace."""
    return {r["country"]: r["values"] for r in topic_values(settings, f"{name}.revenue")}


def end_offsets(settings: Settings, name: str) -> dict[int, int]:
    """Where each partition of the job's revenue topic ends now."""
    found = describe_topic(settings.kafka, f"{name}.revenue")["partitions"]
    return {p["partition"]: p["high_offset"] for p in found}


def published(
    settings: Settings, name: str, ends: dict[int, int], *, after: bool
) -> list[dict[str, Any]]:
    """The committed records of the job's revenue topic after ``ends`` (or before them),
    in the topic's order."""
    return [
        json.loads(m.value() or b"{}")
        for m in read_records(settings.kafka, f"{name}.revenue", start=StartAt(beginning=True))
        if ((m.offset() or 0) >= ends.get(m.partition() or 0, 0)) == after
    ]


def last_versions(records: list[dict[str, Any]], up_to_batch: int) -> dict[str, int]:
    """Each country's last version in ``records`` of batches up to ``up_to_batch``."""
    found: dict[str, int] = {}
    for r in records:
        if int(r["batch"]) <= up_to_batch:
            found[r["country"]] = max(found.get(r["country"], 0), int(r["version"]))
    return found


def changes(records: list[dict[str, Any]]) -> list[tuple[str, int, int, dict[str, Any]]]:
    """(country, version, batch, values) of each record, each (country, version) once."""
    found = [(r["country"], int(r["version"]), int(r["batch"]), r["values"]) for r in records]
    versions = [(country, version) for country, version, _, _ in found]
    assert len(versions) == len(set(versions)), f"a change is in the topic twice: {found}"
    return found


def marker_totals(settings: Settings, name: str) -> dict[str, int]:
    markers = topic_values(settings, f"{name}.commits")
    totals: dict[str, int] = max(markers, key=lambda m: m["batch_id"])["totals"]
    return totals


def run_in_process(
    spark: SparkSession,
    settings: Settings,
    job: Deployed,
    version: str,
    rounds: list[list[dict[str, Any]]],
    n: int,
) -> list[int]:
    """Run ``version`` of the job in this process until it counted ``n`` events, sending
    each of ``rounds`` once the one before is counted (each a batch of its own); the ids
    of the batches its revenue query ran with input."""
    ctx = JobContext(job.name, job.params, spark, settings)
    queries = start_app(load_build(f"savepoint_jobs:{version}"), ctx)
    try:
        for records in rounds:
            counted = events(settings, job.name)
            send_json(settings, job.topic, records, key="buyer")
            wait_events(settings, job.name, counted + 1)
        wait_events(settings, job.name, n)
        # The batch the store shows is published once its transaction commits.
        wait_job(
            settings,
            job.name,
            lambda: True if marker_totals(settings, job.name).get("events") == n else None,
            what=f"{job.name}'s markers to count {n} events",
            timeout=60,
        )
        [revenue] = [q for q in queries if q.name == f"{job.name}.revenue"]
        return [p["batchId"] for p in revenue.recentProgress if p["numInputRows"] > 0]
    finally:
        for query in queries:
            query.stop()


def test_savepoints_of_a_running_and_a_stopped_job_are_listed(
    deployed: Deployed, serving: Settings
) -> None:
    listed = run_kappaflow(serving, "jobs", "savepoints", deployed.name, "--json")
    assert listed.code == 0, listed.err
    rows = [json.loads(line) for line in listed.lines()]
    assert [(r["label"], r["taken_while"]) for r in rows] == [
        ("live", "running"),
        ("before", "stopped"),
    ]
    assert all(datetime.fromisoformat(r["taken_at"]).utcoffset() is not None for r in rows)
    live, before = (manifest(serving, deployed.name, label) for label in ("live", "before"))
    # One entry per read of the source in the query's plan (its dead letters' too).
    offsets = before["outputs"]["revenue"]["source_offsets"]
    assert offsets and all(o == {deployed.topic: {"0": 5}} for o in offsets)
    assert (
        before["outputs"]["revenue"]["batch_id"] >= live["outputs"]["revenue"]["planned_batch_id"]
    )
    assert before["sinks"]["commit_markers"]["revenue"]["totals"]["events"] == 5
    assert (
        before["sinks"]["store_keys"] > 0 and before["plan_fingerprint"] == live["plan_fingerprint"]
    )
    state = savepoint_dir(serving, deployed.name, "before") / "checkpoint" / "revenue" / "state"
    assert any(p.suffix == ".changelog" for p in state.rglob("*")), "RocksDB's files were copied"
    table = run_kappaflow(serving, "jobs", "savepoints", deployed.name)
    assert "live" in table.out and "running" in table.out and "before" in table.out


def test_a_start_from_a_savepoint_takes_a_stateless_change_and_every_sink_is_exact(
    deployed: Deployed, serving: Settings, spark: SparkSession, tmp_path: Path
) -> None:
    """From `before`, with FR left out, the checkpoint moved to another folder (the old one
    set aside); then from `live`, unchanged: the run without the change. Before that
    second start the sinks had seen batches beyond `live`'s checkpoint: left there, they
    would skip the batches Spark plans anew (of other bounds), and a store or lake not put
    back would count them twice."""
    name = deployed.name
    live, before = (manifest(serving, name, label) for label in ("live", "before"))
    moved = serving.model_copy(update={"checkpoint_dir": str(tmp_path / "moved")})
    (Path(serving.checkpoint_location) / name).rename(tmp_path / "set-aside")
    first_run = end_offsets(serving, name)
    restore(moved, name, "savepoint_jobs:without_fr", deployed.params, "before", spark=spark)
    batches = run_in_process(spark, moved, deployed, "without_fr", [ROUND_C], 7)
    changed = stored(serving, name)
    assert changed == {"DE": {"total": 17.5, "n": 5}, "FR": {"total": 12.0, "n": 2}}
    assert events(serving, name) == 7 and marker_totals(serving, name)["events"] == 7
    assert lake_latest(serving, name) == changed
    # Round C's one batch is published once, DE's change the one after the savepoint's.
    original = published(serving, name, first_run, after=False)
    at_before = last_versions(original, before["outputs"]["revenue"]["batch_id"])
    [batch] = batches
    assert changes(published(serving, name, first_run, after=True)) == [
        ("DE", at_before["DE"] + 1, batch, changed["DE"])
    ]
    # FR, which the new code no longer changes, keeps its last change from before.
    assert kafka_latest(serving, name) == changed
    assert [r["values"] for r in original if r["country"] == "FR"][-1] == changed["FR"]

    # Rounds B and C read again, in one batch where they were two.
    second_run = end_offsets(serving, name)
    restore(serving, name, "savepoint_jobs:build", deployed.params, "live", spark=spark)
    batches = run_in_process(spark, serving, deployed, "build", [], 8)
    unchanged = stored(serving, name)
    assert unchanged == {"DE": {"total": 17.5, "n": 5}, "FR": {"total": 15.0, "n": 3}}
    assert changed["DE"] == unchanged["DE"]  # where the filter changes nothing
    assert events(serving, name) == 8 and marker_totals(serving, name)["events"] == 8
    assert lake_latest(serving, name) == unchanged
    at_live = last_versions(original, live["outputs"]["revenue"]["batch_id"])
    [batch] = batches
    assert sorted(changes(published(serving, name, second_run, after=True))) == [
        (country, at_live[country] + 1, batch, unchanged[country]) for country in ("DE", "FR")
    ]
    assert kafka_latest(serving, name) == unchanged


def snapshot(settings: Settings, name: str) -> dict[str, Any]:
    """Everything of job ``name`` a start from a savepoint would change."""
    root = Path(settings.checkpoint_location) / name
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []
    home = JobManager(settings).job_dir(name)
    store = redis.Redis.from_url(settings.redis.effective_url)
    try:
        markers = topic_values(settings, f"{name}.commits")
    except TopicNotFoundError:
        markers = []
    lake = Path(settings.lake_root) / name
    return {
        "checkpoint": {
            str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
        },
        "job": (home / "job.json").read_text(),
        "store": {k: store.dump(k) for k in sorted(store.scan_iter(f"kf:{name}:*"))},
        "markers": markers,
        "lake": sorted(str(p) for p in lake.rglob("*")) if lake.exists() else [],
        "restoring": (home / "restoring.json").exists(),
    }


def test_a_change_the_state_cannot_take_is_refused_with_nothing_changed(
    deployed: Deployed,
    serving: Settings,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = deployed.name
    before = snapshot(serving, name)
    by_buyer = deployed.app("by_buyer")
    check = in_process(
        monkeypatch, capsys, serving, "jobs", "check", name, *by_buyer, "--from-savepoint", "before"
    )
    line = error_line(check, "KF622", 1)
    assert "output 'revenue': by: ['country'] -> ['buyer']" in line
    start = in_process(
        monkeypatch, capsys, serving, "jobs", "start", name, *by_buyer, "--from-savepoint", "before"
    )
    assert error_line(start, "KF622", 1) == line
    assert snapshot(serving, name) == before
    assert JobManager(serving).get_state(name) is JobState.STOPPED

    # A change Spark takes is named, and why.
    elsewhere = (*deployed.app("elsewhere"), "-P", "out=elsewhere")
    checked = in_process(
        monkeypatch,
        capsys,
        serving,
        "jobs",
        "check",
        name,
        *elsewhere,
        "--from-savepoint",
        "before",
    )
    assert checked.code == 0, checked.err
    assert "restart: from savepoint before: compatible" in checked.out
    assert "taken: output revenue: to topic elsewhere" in checked.out
    assert snapshot(serving, name) == before


def test_savepoints_missing_damaged_or_another_jobs_are_refused(
    deployed: Deployed,
    serving: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = deployed.name
    jobs = JobManager(serving)
    other = f"other-{uuid.uuid4().hex[:8]}"
    other_home = jobs.job_dir(other)
    other_home.mkdir(parents=True)
    JobRecord(other, "savepoint_jobs:build", deployed.params, state=JobState.STOPPED).save(
        other_home / "job.json"
    )
    before = {job: snapshot(serving, job) for job in (name, other)}

    def kappaflow(*args: str) -> Result:
        return in_process(monkeypatch, capsys, serving, *args)

    def start(job: str, savepoint: str) -> Result:
        return kappaflow(
            "jobs", "start", job, *deployed.app("build"), "--from-savepoint", savepoint
        )

    missing = error_line(start(name, "nope"), "KF620", 1)
    assert "has no savepoint 'nope' (it has: before, live;" in missing
    broken = savepoint_dir(serving, name, "broken")
    shutil.copytree(savepoint_dir(serving, name, "before"), broken)
    shutil.rmtree(broken / "checkpoint")
    try:
        assert "copy of the checkpoint is missing" in error_line(start(name, "broken"), "KF626", 1)
    finally:
        shutil.rmtree(broken)
    theirs = error_line(start(other, str(savepoint_dir(serving, name, "before"))), "KF621", 1)
    assert f"was taken of job {name!r}, not {other!r}" in theirs
    assert "already has" in error_line(
        kappaflow("jobs", "savepoint", name, "--as", "before"), "KF623", 1
    )
    error_line(kappaflow("jobs", "savepoint", name, "--as", "no/slash"), "KF624", 1)
    assert "not a job on the job API" in error_line(
        kappaflow("jobs", "savepoint", other), "KF625", 1
    )
    error_line(kappaflow("jobs", "savepoints", f"absent-{other}"), "KF601", 1)
    assert {job: snapshot(serving, job) for job in (name, other)} == before

    # A restore cut short: the job starts from a savepoint only.
    (other_home / "restoring.json").write_text('{"savepoint": "before"}')
    unfinished = error_line(kappaflow("jobs", "start", other, *deployed.app("build")), "KF627", 1)
    assert "--from-savepoint before" in unfinished
    assert not (other_home / "driver.pid").exists()


def test_a_running_job_whose_driver_does_not_answer(
    serving: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The request is withdrawn: the driver does not take it later, unasked."""
    name = f"mute-{uuid.uuid4().hex[:8]}"
    home = JobManager(serving).job_dir(name)
    home.mkdir(parents=True)
    JobRecord(name, "savepoint_jobs:build", {}, state=JobState.RUNNING).save(home / "job.json")
    # A process that passes for the job's driver (its command line names the job's home).
    mute = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", f"--kappaflow-job={home}"]
    )
    try:
        (home / "driver.pid").write_text(f"{mute.pid}\n")
        result = in_process(
            monkeypatch, capsys, serving, "jobs", "savepoint", name, "--timeout", "1"
        )
    finally:
        mute.kill()
        mute.wait()
    assert "did not take savepoint" in error_line(result, "KF628", 1)
    assert not (home / "savepoint.request.json").exists()
    assert not (home / "savepoints").exists()


# Which changes a start from a savepoint takes, by the plans alone.


def _output(name: str, *sinks: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "source": "orders", "sinks": list(sinks)}


def test_which_changes_a_savepoint_takes() -> None:
    window = {
        "source": "orders",
        "kind": "windowed aggregate",
        "window_ms": 60_000,
        "by": ["country"],
    }
    held_states = {"revenue": window, "records": {"source": "orders", "kind": "records"}}
    source = {"topic": "orders", "watermark_ms": 10_000, "start": "earliest"}
    lake = {"parquet": "revenue", "location": "/lake/j/revenue"}
    held_plan = {
        "sources": [source],
        "outputs": [
            _output("revenue", {"kafka": "j.revenue"}, lake),
            _output("records", {"kafka": "r"}),
        ],
    }
    states = {
        "revenue": {**window, "by": ["buyer"]},
        "records": {"source": "orders", "kind": "records"},
        "new": {"source": "orders", "kind": "records"},
    }
    plan = {
        "sources": [{**source, "watermark_ms": 5_000}],
        "outputs": [
            _output("revenue", {"kafka": "elsewhere"}, lake, {"redis": "kf:j:revenue:"}),
            _output("records", {"kafka": "r"}, {"parquet": "moved", "location": "/lake/moved"}),
            _output("new", {"kafka": "n"}),
        ],
    }
    changes = compare_plans(held_states, held_plan, states, plan)
    assert [(c.output, c.change, c.taken) for c in changes] == [
        ("new", "output added", True),
        ("revenue", "by: ['country'] -> ['buyer']", False),
        ("revenue", "no longer to topic j.revenue", True),
        ("revenue", "to topic elsewhere", True),
        ("revenue", "to the serving store", True),
        ("records", "to lake table /lake/moved", False),
        (None, "source orders watermark_ms: 10000 -> 5000", True),
    ]
    gone = compare_plans(held_states, held_plan, {"revenue": window}, held_plan)
    assert gone == [Change("records", "output removed", True, "its state stays unused")]

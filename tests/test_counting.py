"""Continuous counting against the real broker, Redis and Spark: its semantics. Exactly-once
through crashes, restarts, a replay and a removal: test_count_recovery.py."""

from __future__ import annotations

import base64
import itertools
import json
import os
import random
import signal
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psutil
import pytest
import redis
from confluent_kafka import Producer
from conftest import Result, RunCli, error_line, run_kappaflow
from live_jobs import send_json, stop_if_running, topic_values, wait_job

from kappaflow.counting.store import CountStats, CountStore
from kappaflow.jobs.manager import JobManager, JobState
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings
from kappaflow.streams.ops.windowing import ENGINE_CONF
from kappaflow.timeutil import from_epoch_ms, iso
from kappaflow.waiting import wait_for

TIME_REFUSED = "time field 'ts' is not epoch milliseconds or ISO-8601 with a zone"
WINDOW_MS = 10_000
# A minute boundary, so windows line up with the events below.
BASE = 1_795_300_000_000 - 1_795_300_000_000 % 60_000
DEFINITION = (
    "--key",
    "page",
    "--time",
    "ts",
    "--id",
    "id",
    "--window",
    "10s",
    "--watermark",
    "5s",
    "--allowed-lateness",
    "20s",
)


def events(n: int = 30, start: int = 0) -> list[dict[str, Any]]:
    """Page views two seconds apart over three pages, ids e<start>…"""
    return [
        {"page": f"/p{i % 3}", "ts": BASE + i * 2000, "id": f"e{i}"}
        for i in range(start, start + n)
    ]


def send(settings: Settings, topic: str, values: Sequence[dict[str, Any] | bytes]) -> None:
    """Page views keyed by their page, and raw records."""
    send_json(settings, topic, values, key="page")


def expected(values: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """Counts per (page, window start), computed without the engine; ids counted once."""
    seen: set[str] = set()
    counts: Counter[tuple[str, int]] = Counter()
    for value in values:
        if value["id"] in seen:
            continue
        seen.add(value["id"])
        counts[(value["page"], value["ts"] - value["ts"] % WINDOW_MS)] += 1
    return dict(counts)


def store_counts(settings: Settings, job: str) -> dict[tuple[str, int], int]:
    store = CountStore(redis_client(settings), job)
    return {(w.key, w.window_start): w.count for w in store.windows()}


def stats(settings: Settings, job: str) -> CountStats:
    return CountStore(redis_client(settings), job).stats()


def changelog(settings: Settings, job: str) -> list[dict[str, Any]]:
    """The changelog as a read_committed consumer sees it, each change as its key, window,
    count and previous count (0 for none: a window's first change, or a retraction)."""
    return [
        {
            "key": c["page"],
            "window_start": c["window_start"],
            "count": (c["values"] or {"count": 0})["count"],
            "previous": (c["previous"] or {"count": 0})["count"],
            "kind": c["kind"],
            "version": c["version"],
        }
        for c in topic_values(settings, f"{job}.counts")
    ]


def start(
    cli: RunCli, job: str, source: str, *extra: str, env: dict[str, str] | None = None
) -> Result:
    result = cli("count", "start", job, "--source", source, *DEFINITION, *extra, env=env)
    assert result.code == 0, result.err
    return result


def wait_stats(settings: Settings, job: str, **wanted: int) -> CountStats:
    def reached() -> CountStats | None:
        current = stats(settings, job)
        return current if all(getattr(current, k) >= v for k, v in wanted.items()) else None

    return wait_job(settings, job, reached, what=f"{job} to reach {wanted}")


@pytest.fixture
def job_name(serving: Settings) -> Iterator[str]:
    name = f"count-{uuid.uuid4().hex[:8]}"
    yield name
    stop_if_running(serving, name)


def test_event_time_corrections_late_events_and_dead_letters(
    cli: RunCli, serving: Settings, new_topic: Callable[..., str], job_name: str
) -> None:
    source = new_topic(partitions=2)
    first = events()
    duplicate = dict(first[0])
    disordered: list[dict[str, Any] | bytes] = [*first, duplicate, b"garbage", b'{"page": "/x"}']
    random.Random(7).shuffle(disordered)
    send(serving, source, disordered)
    start(cli, job_name, source)
    wait_stats(serving, job_name, counted=30, duplicates=1, dead_letters=2)

    # The watermark is now BASE+58s-5s: windows ending by BASE+50s become final.
    def finals() -> bool | None:
        final = [
            w
            for w in CountStore(
                redis.Redis.from_url(serving.redis.effective_url), job_name
            ).windows()
            if w.final
        ]
        return True if len(final) == 15 else None

    wait_for(finals, timeout=120, what="the windows behind the watermark to be final")
    assert store_counts(serving, job_name) == expected(first)

    correction = {"page": "/p0", "ts": BASE + 45_000, "id": "late-but-allowed"}
    too_late = {"page": "/p0", "ts": BASE + 5_000, "id": "too-late"}
    send(serving, source, [correction, too_late])
    wait_stats(serving, job_name, counted=31, late=1)

    want = expected([*first, correction])
    assert store_counts(serving, job_name) == want
    # The job's progress file trails the store by up to half a second.
    status = wait_for(
        lambda: (lambda st: st if st["lag"] == 0 else None)(
            json.loads(cli("count", "status", job_name).out)
        ),
        timeout=30,
        what="count status to show no lag",
    )
    # 35 records sent: measured from the source offsets the job consumed, and accounted
    # for by what the job did with each of them.
    assert (status["events_read"], status["accounted"]) == (35, 35)
    assert status["watermark"] == "2026-11-21T22:26:53.000Z"  # BASE+58s (newest) - 5s
    assert status["state"] == "running"
    assert (
        status["counted"],
        status["duplicates_dropped"],
        status["late"],
        status["dead_letters"],
    ) == (31, 1, 1, 2)

    # A count job is a job on the job API: jobs status accounts for its one output too
    # (from the output's last commit marker, written after Redis).
    def counts_output() -> dict[str, Any] | None:
        out = json.loads(cli("jobs", "status", job_name, "--json").out)["outputs"]["counts"]
        return out if out.get("events_read") == 35 else None

    output = wait_for(counts_output, timeout=30, what="jobs status to show 35 events read")
    read = (output["events"], output["duplicates"], output["late"], output["dead_letters"])
    assert read == (31, 1, 1, 2)

    changes = changelog(serving, job_name)
    by_window: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for change in changes:
        by_window[(change["key"], change["window_start"])].append(change)
    for history in by_window.values():
        assert [c["version"] for c in history] == list(range(1, len(history) + 1))
        for before, after in itertools.pairwise(history):
            assert after["previous"] == before["count"]
        assert history[0]["kind"] == "provisional" and history[0]["previous"] == 0
    corrected = by_window[("/p0", "2026-11-21T22:26:40.000Z")]
    assert [c["kind"] for c in corrected] == ["provisional", "final", "correction"]
    assert (corrected[-1]["previous"], corrected[-1]["count"]) == (2, 3)

    late = topic_values(serving, f"{job_name}.late", at_least=1)
    assert len(late) == 1
    assert json.loads(late[0]["event"])["id"] == "too-late"
    assert late[0]["reason"].startswith("too late") and late[0]["watermark"]
    dead = topic_values(serving, f"{job_name}.dlq", at_least=2)
    assert sorted(d["error"] for d in dead) == ["missing time field 'ts'", "not valid JSON"]
    assert all(d["source_topic"] == source for d in dead)

    rows = [json.loads(line) for line in cli("counts", job_name, "--key", "/p0").lines()]
    assert {r["window_start"]: r["count"] for r in rows}["2026-11-21T22:26:40.000Z"] == 3
    final_only = cli("counts", job_name, "--final-only").lines()
    assert len(final_only) == 15


def test_events_read_from_a_time_through_a_restart_and_a_rewind(
    cli: RunCli, serving: Settings, new_topic: Callable[..., str], job_name: str
) -> None:
    """A job started at a time has read what came after it, not the offsets before it;
    started again at that time, it reads those events again, and each read counts: the
    events read stay equal to those accounted (the re-read ones dropped as duplicates)."""
    source = new_topic(partitions=2)
    send(serving, source, events(3, start=100))
    # Kafka stamps records when they are sent: after the three above, before the rest.
    since = iso(from_epoch_ms(int(datetime.now(UTC).timestamp() * 1000) + 1))

    def status() -> dict[str, Any]:
        found: dict[str, Any] = json.loads(cli("count", "status", job_name).out)
        return found

    start(cli, job_name, source, "--from-time", since)
    send(serving, source, events(4))
    wait_stats(serving, job_name, counted=4)
    first = status()
    assert (first["events_read"], first["accounted"], first["counted"]) == (4, 4, 4)
    assert cli("count", "stop", job_name).code == 0
    # Sent while the job is stopped; started at the same time again, the job reads the
    # first four again, then these.
    send(serving, source, events(3, start=4))
    start(cli, job_name, source, "--from-time", since)
    wait_stats(serving, job_name, counted=7, duplicates=4)
    again = status()
    assert (again["counted"], again["duplicates_dropped"], again["late"]) == (7, 4, 0)
    assert (again["events_read"], again["accounted"]) == (4 + 4 + 3, 11)


def test_event_times_keys_and_every_dead_letter_reason(
    cli: RunCli, serving: Settings, new_topic: Callable[..., str], job_name: str
) -> None:
    source = new_topic()
    iso_z = iso(from_epoch_ms(BASE + 3_000))  # 2026-…T…Z
    offset = datetime.fromtimestamp((BASE + 4_000) / 1000, tz=timezone(timedelta(hours=2)))
    good = [
        {"page": "/a", "ts": BASE + 1_000},  # epoch ms
        {"page": "/a", "ts": str(BASE + 2_000)},  # epoch ms as a numeric string
        {"page": "/a", "ts": iso_z},  # ISO-8601 in UTC
        {"page": "/a", "ts": offset.isoformat()},  # ISO-8601 with an offset
        {"page": 7, "ts": BASE + 5_000},  # a numeric key
    ]
    bad: list[tuple[bytes | None, str]] = [
        (None, "empty record"),
        (b"nope", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"ts": 1}', "missing key field 'page'"),
        (b'{"page": ["x"], "ts": 1}', "key field 'page' is not a string or a number"),
        (b'{"page": "/a"}', "missing time field 'ts'"),
        (b'{"page": "/a", "ts": "yesterday"}', TIME_REFUSED),
        (b'{"page": "/a", "ts": "2026-11-21T22:26:40"}', TIME_REFUSED),  # no zone
    ]
    producer = Producer(serving.kafka.client_config())
    for value in good:
        producer.produce(source, value=json.dumps(value).encode())
    for raw, _ in bad:
        producer.produce(source, value=raw)
    assert producer.flush(30) == 0
    result = cli("count", "start", job_name, "--source", source, "--key", "page", "--time", "ts",
                 "--window", "10s")  # fmt: skip
    assert result.code == 0, result.err
    wait_stats(serving, job_name, counted=len(good), dead_letters=len(bad))

    assert store_counts(serving, job_name) == {("/a", BASE): 4, ("7", BASE): 1}
    # The store's statistics are written before the batch's Kafka transaction commits:
    # the dead letters are read once they are all there.
    dead = topic_values(serving, f"{job_name}.dlq", at_least=len(bad))
    assert sorted(d["error"] for d in dead) == sorted(reason for _, reason in bad)
    by_offset = {d["source_offset"]: d for d in dead}
    for offset_, (raw, reason) in enumerate(bad, start=len(good)):
        letter = by_offset[offset_]
        assert letter["error"] == reason
        original = base64.b64decode(letter["value_base64"]) if letter["value_base64"] else None
        assert original == raw  # the original bytes, and where they came from
        assert (letter["source_topic"], letter["source_partition"]) == (source, 0)


def test_count_cli_misuse(serving: Settings, new_topic: Callable[..., str]) -> None:
    source = new_topic()

    def run(*args: str) -> Result:
        return run_kappaflow(
            serving, "count", "start", "bad", "--source", source, "--key", "k", "--time", "t", *args
        )

    both = run("--window", "1m", "--session-gap", "5m")
    assert both.code != 0 and "exactly one of" in both.err
    assert "invalid duration" in run("--window", "soon").err
    assert "--slide must divide" in run("--window", "1m", "--slide", "7s").err
    missing = run_kappaflow(
        serving,
        "count",
        "start",
        "bad",
        "--source",
        "no-such-topic",
        "--key",
        "k",
        "--time",
        "t",
        "--window",
        "1m",
    )
    assert "no-such-topic" in error_line(missing, "KF404", 1)
    assert JobManager(serving).get_state("bad") is JobState.ABSENT  # no job was started
    assert "no job named" in error_line(run_kappaflow(serving, "counts", "nope"), "KF601", 1)
    assert "no job named" in error_line(
        run_kappaflow(serving, "count", "status", "nope"), "KF601", 1
    )


def engine_env(settings: Settings, engine: str) -> dict[str, str]:
    """The environment of a command whose jobs' windows start on operator ``engine``."""
    conf = {**settings.spark.conf, ENGINE_CONF: engine}
    return {"KAPPAFLOW_SPARK__CONF": json.dumps(conf)}


# The state is read back from either window operator's layout.
@pytest.mark.parametrize("engine", ["python", "jvm"])
def test_sliding_windows_and_state_readback(
    cli: RunCli, serving: Settings, new_topic: Callable[..., str], job_name: str, engine: str
) -> None:
    source = new_topic()
    values = events(20)
    send(serving, source, values)
    # 10s windows every 5s
    start(cli, job_name, source, "--slide", "5s", env=engine_env(serving, engine))
    wait_stats(serving, job_name, counted=20)
    want: Counter[tuple[str, int]] = Counter()
    for value in values:
        newest = value["ts"] - value["ts"] % 5000
        for window_start in (newest, newest - 5000):
            want[(value["page"], window_start)] += 1
    wait_for(
        lambda: True if store_counts(serving, job_name) == dict(want) else None,
        timeout=60,
        what="sliding counts",
    )
    assert stats(serving, job_name).counted == 20  # events, not window increments

    from_store = {
        (r["key"], r["window_start"]): r["count"]
        for r in map(json.loads, cli("counts", job_name).lines())
    }

    def from_state() -> list[dict[str, Any]] | None:
        # The store is written before the batch's checkpoint commits, and the state is
        # read as of the last committed batch: it holds the windows once that commits.
        found = [json.loads(line) for line in cli("counts", job_name, "--from-state").lines()]
        return found or None

    held = wait_for(from_state, timeout=60, what="the state to hold the windows still open")
    for row in held:
        assert from_store[(row["key"], row["window_start"])] == row["count"]


def test_realtime_mode_previews_counts_beside_the_exactly_once_path(
    cli: RunCli, serving: Settings, new_topic: Callable[..., str], job_name: str
) -> None:
    source = new_topic(partitions=2)
    start(cli, job_name, source, "--realtime")
    values = events(30)
    send(serving, source, values)
    wait_stats(serving, job_name, counted=30)
    want = expected(values)
    assert store_counts(serving, job_name) == want

    def realtime_counts() -> dict[tuple[str, int], int] | None:
        latest: dict[tuple[str, int], int] = {}
        for m in read_records(serving.kafka, f"{job_name}.counts", start=StartAt(beginning=True)):
            value = json.loads(m.value() or b"{}")
            if value.get("mode") == "realtime":
                window = (value["page"], int(json.loads(m.key() or b"[]")[1]))
                latest[window] = max(latest.get(window, 0), value["values"]["count"])
        return latest if latest == want else None

    wait_for(realtime_counts, timeout=120, what="real-time counts to match")

    def both_paths() -> defaultdict[bytes, set[tuple[str, int | None]]] | None:
        # The store is written before the micro-batch's Kafka transaction commits: the
        # topic has every window from both paths once that commits.
        topic = f"{job_name}.counts"
        found: defaultdict[bytes, set[tuple[str, int | None]]] = defaultdict(set)
        for m in read_records(serving.kafka, topic, start=StartAt(beginning=True)):
            value = json.loads(m.value() or b"{}")
            # The micro-batch path's records name their batch; the real-time ones their mode.
            mode = value.get("mode", "micro-batch" if "batch" in value else None)
            found[m.key() or b""].add((mode, m.partition()))
            if mode == "realtime":
                assert value["kind"] == "provisional" and value["latest_event"]
        complete = all(
            {mode for mode, _ in seen} == {"realtime", "micro-batch"} for seen in found.values()
        )
        return found if found and complete else None

    partitions = wait_for(both_paths, timeout=60, what="both paths' records of every window")
    for key, seen in partitions.items():
        modes = {mode for mode, _ in seen}
        assert modes == {"realtime", "micro-batch"}, key
        assert len({partition for _, partition in seen}) == 1, f"{key!r} in two partitions"
    status = json.loads(cli("count", "status", job_name).out)
    assert status["state"] == "running" and status["counted"] == 30
    assert status["realtime"] == "running"

    # The real-time query runs in a driver process of its own, the job's main driver's
    # child; killed, the main driver takes it down with it: nothing is left running.
    home = serving.jobs_dir / job_name
    driver = JobManager(serving).get(job_name).pid
    part = json.loads((home / "realtime.json").read_text())
    assert part["state"] == "running" and part["pid"] != driver
    assert psutil.Process(part["pid"]).ppid() == driver
    os.kill(driver, signal.SIGKILL)
    wait_for(
        lambda: True if _gone(part["pid"]) else None,
        timeout=60,
        what="the real-time part to stop after its job's driver was killed",
    )
    assert json.loads((home / "realtime.json").read_text())["state"] == "stopped"
    assert "main driver is gone" in (home / "realtime.log").read_text()
    status = json.loads(cli("count", "status", job_name).out)
    assert (status["state"], status["realtime"]) == ("crashed", "stopped")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("engine", ["python", "jvm"])
def test_session_windows(
    cli: RunCli, serving: Settings, new_topic: Callable[..., str], job_name: str, engine: str
) -> None:
    source = new_topic()

    def view(page: str, at: int, n: int) -> dict[str, Any]:
        return {"page": page, "ts": BASE + at, "id": f"s{n}"}

    # /a: a session of three views, then one 10 s later; /b: one view.
    first = [view("/a", 0, 0), view("/a", 2000, 1), view("/a", 4000, 2), view("/b", 1000, 3)]
    first.append(view("/a", 14_000, 4))
    send(serving, source, first)
    result = cli(
        "count", "start", job_name, "--source", source, "--key", "page", "--time", "ts",
        "--id", "id", "--session-gap", "3s", "--watermark", "1s", "--allowed-lateness", "30s",
        env=engine_env(serving, engine),
    )  # fmt: skip
    assert result.code == 0, result.err
    wait_stats(serving, job_name, counted=5)
    assert store_counts(serving, job_name) == {
        ("/a", BASE): 3,
        ("/a", BASE + 14_000): 1,
        ("/b", BASE + 1000): 1,
    }
    # Views at 6.5 s, 9 s and 11.5 s, behind the watermark but within the allowed
    # lateness, bridge /a's two sessions into one; a repeated view is dropped.
    send(serving, source, [view("/a", 6500, 5), view("/a", 9000, 6), view("/a", 11_500, 7)])
    send(serving, source, [first[0]])
    wait_stats(serving, job_name, counted=8, duplicates=1)
    want = {("/a", BASE): 7, ("/b", BASE + 1000): 1}
    wait_for(
        lambda: True if store_counts(serving, job_name) == want else None,
        timeout=60,
        what="the sessions to merge",
    )
    windows = [json.loads(line) for line in cli("counts", job_name, "--key", "/a").lines()]
    # The bridged session ends at 17 s, past the watermark (13 s): corrected, not final.
    assert [(w["window_start"], w["window_end"], w["count"], w["final"]) for w in windows] == [
        (iso(from_epoch_ms(BASE)), iso(from_epoch_ms(BASE + 17_000)), 7, False)
    ]

    def retractions() -> list[dict[str, Any]] | None:
        # The store is written before the batch's Kafka transaction commits.
        return [c for c in changelog(serving, job_name) if c["count"] == 0] or None

    retracted = wait_for(retractions, timeout=60, what="the retraction in the changelog")
    assert all(c["kind"] == "correction" and c["key"] == "/a" for c in retracted)
    assert ("/a", 1) in [(c["key"], c["previous"]) for c in retracted]  # the 14 s session
    status = json.loads(cli("count", "status", job_name).out)
    assert status["events_read"] == 9
    from_state = {
        (r["key"], r["count"])
        for r in map(json.loads, cli("counts", job_name, "--from-state").lines())
    }
    assert from_state == {("/a", 7), ("/b", 1)}

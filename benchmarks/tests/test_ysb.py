"""The Yahoo Streaming Benchmark: generator, Redis layout, check, results, and a real run."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from confluent_kafka import Producer
from conftest import REPO, Result, error_line, settings_env

from kappaflow.kafka.topics import list_topics
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for
from kappaflow_bench.report import percentile
from kappaflow_bench.ysb.check import compare, expected_counts, read_all
from kappaflow_bench.ysb.generator import generate, run_processes
from kappaflow_bench.ysb.results import latency_summary, window_latencies
from kappaflow_bench.ysb.store import (
    YSB_DB,
    WindowStat,
    WindowWriter,
    ad_campaigns,
    connect,
    get_stats,
    new_ads,
    new_setup,
)
from kappaflow_bench.ysb.workload import AD_TYPES, EVENT_TYPES, event_json

UUID = "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
EVENT = re.compile(
    f'^{{"user_id": "({UUID})", "page_id": "({UUID})", "ad_id": "({UUID})", '
    f'"ad_type": "({"|".join(AD_TYPES)})", "event_type": "({"|".join(EVENT_TYPES)})", '
    '"event_time": "([0-9]{13})", "ip_address": "1.2.3.4"}$'
)


def values(settings: Settings, topic: str) -> list[str]:
    return [(m.value() or b"").decode() for m in read_all(settings.kafka, topic)]


def test_events_have_the_original_schema_and_distributions(
    serving: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    store = connect(serving.redis.effective_url)
    rng = random.Random(7)
    campaigns = new_setup(store, rng)
    ads = new_ads(store, rng)
    table = ad_campaigns(store)
    assert len(campaigns) == 100 and len(set(ads)) == 1000 and table.keys() == set(ads)
    assert set(Counter(table.values()).values()) == {10}  # 10 ads per campaign
    assert set(table.values()) == set(campaigns)

    start_ns = time.time_ns()
    stats = generate(
        serving.kafka.client_config(),
        topic,
        rate=30_000,
        duration_s=1.0,
        ads=ads,
        start_ns=start_ns,
        seed=1,
    )
    assert stats.events == 30_000 and stats.delivery_errors == 0
    sent = values(serving, topic)
    assert len(sent) == 30_000
    fields = [EVENT.match(v) for v in sent]
    assert all(fields), next(v for v, f in zip(sent, fields, strict=True) if f is None)
    parsed = [json.loads(v) for v in sent]
    assert all(isinstance(x, str) for event in parsed for x in event.values())
    assert len({e["user_id"] for e in parsed}) == 100
    assert len({e["page_id"] for e in parsed}) == 100
    assert {e["ad_id"] for e in parsed} <= set(ads)
    # Uniform: each of 3 event types ~10,000 and 5 ad types ~6,000 (sd ~80); 6 sd slack.
    for field, kinds in (("event_type", EVENT_TYPES), ("ad_type", AD_TYPES)):
        counts = Counter(e[field] for e in parsed)
        assert set(counts) == set(kinds)
        assert all(abs(n - 30_000 / len(kinds)) < 500 for n in counts.values()), counts
    # event_time is the schedule, not the send time: event i at start + i/rate.
    expected_times = sorted((start_ns + i * 10**9 // 30_000) // 10**6 for i in range(30_000))
    assert sorted(int(e["event_time"]) for e in parsed) == expected_times


def test_a_generator_behind_schedule_keeps_the_scheduled_times(
    kafka: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic()
    called_ns = time.time_ns()
    start_ns = called_ns - 3 * 10**9  # the whole schedule is already 1 to 3 s late
    stats = generate(
        kafka.kafka.client_config(),
        topic,
        rate=1_000,
        duration_s=2.0,
        ads=["a"],
        start_ns=start_ns,
    )
    assert stats.events == 2_000
    # The first event was due 3 s before the call and the last 1 s before it: each is
    # sent later still, however busy the machine, so every one counts as behind and the
    # first at least by those 3 s.
    assert stats.events_behind == 2_000
    assert stats.max_behind_ms >= (called_ns - start_ns) // 10**6
    times = sorted(int(json.loads(v)["event_time"]) for v in values(kafka, topic))
    assert times[0] == start_ns // 10**6 and times[-1] == (start_ns + 1_999 * 10**6) // 10**6


def test_processes_share_the_rate_and_the_schedule(
    kafka: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    ads = [[f"ad-{p}-{n}" for n in range(10)] for p in range(2)]
    stats = run_processes(
        kafka.kafka.client_config(), topic, rate=2_001, duration_s=1.5, ads_per_process=ads
    )
    assert stats.processes == 2 and stats.events == 3_001 and stats.delivery_errors == 0
    # No event is sent before it is due, so the run lasts at least its schedule (a busy
    # machine only makes it longer).
    assert stats.seconds >= 1.49
    assert stats.first_event_ms is not None and stats.last_event_ms is not None
    sent = [json.loads(v) for v in values(kafka, topic)]
    for p in range(2):
        mine = sorted(int(e["event_time"]) for e in sent if e["ad_id"].startswith(f"ad-{p}-"))
        # Each process holds to its share of the rate, on the one schedule: about 1,000
        # events a second, from the common start to 1.5 s later.
        assert len(mine) in (1_500, 1_501)
        assert mine[0] == stats.first_event_ms
        assert stats.last_event_ms - 3 <= mine[-1] <= stats.last_event_ms


def test_the_benchmark_keeps_to_its_own_database(serving: Settings) -> None:
    url = serving.redis.effective_url
    assert url.endswith("/0")
    other = redis.Redis.from_url(url)
    other.set("not-ysb", "kept")
    store = connect(url)
    new_setup(store, random.Random(5))
    assert store.connection_pool.connection_kwargs["db"] == YSB_DB
    assert other.get("not-ysb") == b"kept" and store.get("not-ysb") is None
    other.delete("not-ysb")


def test_windows_in_the_original_layout(serving: Settings) -> None:
    store = connect(serving.redis.effective_url)
    campaigns = new_setup(store, random.Random(3))
    writer = WindowWriter(store)
    writer.write([(campaigns[0], 10_000, 5), (campaigns[1], 10_000, 2)], now_ms=20_250)
    writer.write([(campaigns[0], 10_000, 7), (campaigns[0], 20_000, 1)], now_ms=21_000)
    # A second writer (a restarted job) writing the same windows again changes nothing.
    WindowWriter(store).write([(campaigns[0], 20_000, 1)], now_ms=21_000)
    stats = {(s.campaign, s.window_start): s for s in get_stats(store)}
    assert stats == {
        (campaigns[0], 10_000): WindowStat(campaigns[0], 10_000, 7, 21_000),
        (campaigns[1], 10_000): WindowStat(campaigns[1], 10_000, 2, 20_250),
        (campaigns[0], 20_000): WindowStat(campaigns[0], 20_000, 1, 21_000),
    }
    windows_list = store.hget(campaigns[0], "windows")
    assert windows_list is not None
    assert store.lrange(windows_list, 0, -1) == [b"20000", b"10000"]  # newest first
    assert stats[(campaigns[0], 10_000)].updated == 11_000


def test_batch_counts_are_added_once(serving: Settings) -> None:
    store = connect(serving.redis.effective_url)
    campaigns = new_setup(store, random.Random(4))
    writer = WindowWriter(store)
    assert writer.add([(campaigns[0], 0, 3)], now_ms=10_100, fence=("job", 0))
    assert writer.add([(campaigns[0], 0, 2), (campaigns[1], 0, 1)], 10_200, fence=("job", 1))
    # Batch 1 again (Spark replaying it after a crash), from a new writer: skipped.
    assert not WindowWriter(store).add([(campaigns[0], 0, 2)], 10_300, fence=("job", 1))
    assert WindowWriter(store).add([(campaigns[0], 0, 1)], 10_400, fence=("other", 1))
    stats = {s.campaign: (s.seen_count, s.time_updated) for s in get_stats(store)}
    assert stats == {campaigns[0]: (6, 10_400), campaigns[1]: (1, 10_200)}
    assert ad_campaigns(store) == {}  # the fences are no ads


def test_check_recomputes_every_window_from_the_log(
    kafka: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    table = {"ad1": "c1", "ad2": "c2"}
    events = [
        event_json("u", "p", "ad1", "banner", "view", 10_001),
        event_json("u", "p", "ad1", "banner", "view", 19_999),
        event_json("u", "p", "ad1", "banner", "click", 12_000),
        event_json("u", "p", "ad2", "mail", "view", 20_000),
        event_json("u", "p", "ad9", "mail", "view", 20_000),  # not in the table
        "not json",
    ]
    producer = Producer(kafka.kafka.client_config())
    for value in events:
        producer.produce(topic, value.encode())
    assert producer.flush(30) == 0
    expected = expected_counts(kafka.kafka, topic, table)
    assert expected.counts == Counter({("c1", 10_000): 2, ("c2", 20_000): 1})
    assert (expected.events, expected.views, expected.unknown) == (6, 3, 2)
    assert (expected.first_event_ms, expected.last_event_ms) == (10_001, 20_000)
    assert compare(expected.counts, {("c1", 10_000): 2, ("c2", 20_000): 1}) == []
    wrong = compare(expected.counts, {("c1", 10_000): 1, ("c3", 0): 4})
    assert [(m.campaign, m.window_start, m.expected, m.actual) for m in wrong] == [
        ("c3", 0, 0, 4),
        ("c1", 10_000, 2, 1),
        ("c2", 20_000, 1, None),
    ]


def test_latency_by_the_original_method() -> None:
    stats = [
        WindowStat("c", 0, 1, 10_500),  # 500 ms after the window closed
        WindowStat("c", 10_000, 1, 19_000),  # last written before it closed: left out
        WindowStat("c", 20_000, 1, 31_200),
        WindowStat("c", 30_000, 1, 40_100),
    ]
    assert window_latencies(stats) == [500, 1_200, 100]
    assert window_latencies(stats, measured_from_ms=20_000) == [1_200, 100]
    assert percentile([5, 1, 3, 2, 4], 50) == 3 and percentile([], 99) is None
    summary = latency_summary(list(range(1, 101)))
    assert (summary["p50"], summary["p99"], summary["max"]) == (50, 99, 100)


def run_bench(settings: Settings, *args: str, timeout: float = 180) -> Result:
    """Run the real `kappaflow-bench` command in a process of its own."""
    proc = subprocess.run(
        [sys.executable, "-m", "kappaflow_bench", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **settings_env(settings)},
        timeout=timeout,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def misuse(result: Result, code: str) -> str:
    """The one error line of ``kappaflow-bench`` misuse (exit status 2)."""
    return error_line(result, code, 2, "kappaflow-bench")


def test_bench_ysb_misuse(kafka: Settings, tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    base = ("ysb", "--rate", "100", "--duration", "5", "--out", out)
    assert "storm" in misuse(run_bench(kafka, *base, "--engine", "storm"), "KF001")
    line = misuse(run_bench(kafka, *base[:1], "--engine", "spark", "--out", out), "KF001")
    assert "--rate" in line
    bad_rate = ("ysb", "--engine", "spark", "--rate", "0", "--duration", "5")
    assert "--rate" in misuse(run_bench(kafka, *bad_rate, "--out", out), "KF001")
    warm = run_bench(kafka, *base, "--engine", "spark", "--warmup", "90")
    assert "--warmup" in misuse(warm, "KF001")
    sweep = ("ysb-sweep", "--out", out)
    assert "storm" in misuse(run_bench(kafka, *sweep, "--engines", "flink,storm"), "KF001")
    assert "--rates" in misuse(run_bench(kafka, *sweep, "--rates", "2000,1000"), "KF001")
    assert "--rates" in misuse(run_bench(kafka, *sweep, "--rates", "1000,x"), "KF001")
    twice = run_bench(kafka, *sweep, "--engines", "quix,quix")
    assert "twice" in misuse(twice, "KF001")
    assert not (tmp_path / "out").exists()


def test_bench_ysb_generator_prints_its_maximum_rate(serving: Settings) -> None:
    result = run_bench(serving, "ysb-generator", "--events", "20000")
    assert result.code == 0, result.err
    assert re.search(r"maximum rate\W+[0-9,]+ events/s", result.out), result.out
    assert not any(t.startswith("ysb.") for t in _topics(serving))


@pytest.mark.timeout(300)
def test_bench_ysb_micro_batch_end_to_end(serving: Settings, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_bench(
        serving,
        "ysb",
        "--engine",
        "spark",
        "--rate",
        "2000",
        # At least one full 10 s window, the only kind the latency figures count.
        "--duration",
        "25",
        "--warmup",
        "0",
        "--out",
        str(out),
        timeout=280,
    )
    assert result.code == 0, result.err
    summary = json.loads((out / "result.json").read_text())
    assert summary["engine"] == "spark" and summary["sink"] == "redis"
    assert summary["mismatched_windows"] == 0
    # The generator sent every event it was asked for, never ahead of its schedule.
    generator = summary["generator"]
    assert (generator["events"], generator["delivery_errors"]) == (50_000, 0)
    assert summary["events"] >= 52_000 and 0 < summary["rate_achieved"] <= 2_000 * 1.001
    # 25 s of events span 3 or 4 windows for each of the 100 campaigns, and the warm-up
    # second 1 or 2 more.
    assert 300 <= summary["windows"] <= 700
    assert summary["views"] == sum(map(int, (out / "seen.txt").read_text().split()))
    updated = (out / "updated.txt").read_text().split()
    assert len(updated) == summary["windows"]
    assert summary["latency_ms"]["p50"] is not None and summary["windows_measured"] > 0
    assert summary["versions"]["engine"].startswith("pyspark 4.3")
    assert (out / "latency.png").stat().st_size > 0
    assert "running" in (out / "engine.log").read_text()  # the Spark driver's log, kept
    # The run cleaned up after itself: its topics are deleted.
    wait_for(
        lambda: True if not any(t.startswith("ysb.") for t in _topics(serving)) else None,
        timeout=30,
        what="the run's topics to be deleted",
    )


@pytest.fixture(scope="session")
def peer_engines(settings: Settings) -> Path:
    """The peers' virtual environments outside the session's state directory, made once
    and kept between sessions (installing PyFlink takes a minute or two)."""
    shared = Path(os.environ.get("KAPPAFLOW_TEST_ENGINES_DIR", REPO / ".kappaflow" / "engines"))
    shared.mkdir(parents=True, exist_ok=True)
    link = settings.state_dir / "engines"
    if not link.exists():
        link.symlink_to(shared.resolve(), target_is_directory=True)
    return shared


def _no_flink_left(run_name_prefix: str) -> bool:
    """No process of a Flink run is left (the JVM's command line names the run's
    directory, in its log file's path)."""
    for proc in psutil.process_iter(["cmdline"]):
        if any(run_name_prefix in part for part in proc.info["cmdline"] or ()):
            return False
    return True


def _short_run(serving: Settings, out: Path, engine: str, sink: str) -> dict[str, Any]:
    """``kappaflow-bench ysb`` of ``engine`` for 22 s at 2,000 events/s: it exits 0, and
    every window it wrote matches the log."""
    result = run_bench(
        serving,
        *("ysb", "--engine", engine, "--sink", sink, "--rate", "2000"),
        *("--duration", "22", "--warmup", "0", "--out", str(out)),
        timeout=580,
    )
    assert result.code == 0, result.err
    summary: dict[str, Any] = json.loads((out / "result.json").read_text())
    assert (summary["engine"], summary["sink"]) == (engine, sink)
    assert summary["mismatched_windows"] == 0 and summary["events"] >= 46_000
    assert summary["windows_measured"] > 0 and summary["latency_ms"]["p50"] is not None
    return summary


@pytest.mark.timeout(600)
def test_bench_ysb_flink_end_to_end(serving: Settings, peer_engines: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    summary = _short_run(serving, out, "flink", "redis")
    assert summary["views"] == sum(map(int, (out / "seen.txt").read_text().split()))
    assert summary["versions"]["engine"] == "pyflink 2.2.1"
    assert summary["versions"]["flink_kafka_connector"] == "5.0.0-2.2"
    assert summary["config"]["engine"]["parallelism"] == 2
    assert "flink app running" in (out / "engine.log").read_text()
    assert "switched from" in (out / "flink.log").read_text()  # the JVM's own log, kept
    wait_for(
        lambda: True if not any(t.startswith("ysb") for t in _topics(serving)) else None,
        timeout=30,
        what="the run's topics (and the relay topic) to be deleted",
    )
    assert _no_flink_left(str(peer_engines.resolve() / "flink" / "state" / "ysb-flink-"))


@pytest.mark.timeout(600)
def test_bench_ysb_quix_end_to_end(serving: Settings, peer_engines: Path, tmp_path: Path) -> None:
    """Quix Streams, in its own virtual environment, through the Kafka sink: every window
    it published is checked against the log."""
    out = tmp_path / "run"
    summary = _short_run(serving, out, "quix", "kafka")
    assert summary["versions"]["engine"].startswith("quixstreams ")
    assert "quix app running" in (out / "engine.log").read_text()
    wait_for(
        lambda: (
            True
            if not any(t.startswith("ysb") or "ysb-quix" in t for t in _topics(serving))
            else None
        ),
        timeout=30,
        what="the run's topics (and Quix's repartition and changelog topics) to be deleted",
    )
    assert not any(
        "kappaflow_bench.ysb.quix_app" in " ".join(proc.info["cmdline"] or ())
        for proc in psutil.process_iter(["cmdline"])
    )


@pytest.mark.timeout(900)
def test_bench_ysb_sweep_of_flink_with_the_kafka_sink(
    serving: Settings, peer_engines: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sweep"
    result = run_bench(
        serving,
        *("ysb-sweep", "--engines", "flink", "--sink", "kafka"),
        *("--rates", "1000,2000", "--duration", "22", "--warmup", "0"),
        # A loose bound: the test is about the sweep, not this busy machine's latency.
        *("--max-p99", "60000", "--out", str(out)),
        timeout=880,
    )
    assert result.code == 0, result.err
    sweep = json.loads((out / "sweep.json").read_text())
    assert (sweep["engines"], sweep["sink"], sweep["rates"]) == (["flink"], "kafka", [1000, 2000])
    points = sweep["points"]
    assert [(p["rate"], p["mismatched_windows"]) for p in points] == [(1000, 0), (2000, 0)]
    assert all(p["sustainable"] for p in points), points
    assert sweep["max_sustainable_rate"] == {"flink": 2000}
    assert all(len(p["load_average_at_start"]) == 3 for p in points)
    for rate in (1000, 2000):
        run = json.loads((out / "flink" / str(rate) / "result.json").read_text())
        assert (run["engine"], run["sink"], run["rate_offered"]) == ("flink", "kafka", rate)
    assert (out / "p99.png").stat().st_size > 0
    assert re.search(r"flink\W+2,000", result.out), result.out  # the maximum, printed


def _topics(settings: Settings) -> list[str]:
    return [str(row["name"]) for row in list_topics(settings.kafka)]

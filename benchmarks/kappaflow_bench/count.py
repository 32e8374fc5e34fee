"""The counting benchmark: throughput and latency of the count job on this machine.

Three measurements in one run, on the same broker and machine:

1. ceiling: how fast the raw topic can be read (Spark's Kafka source, counting rows, and
   a confluent-kafka consumer), the upper bound for any job reading it;
2. throughput: a backlog of ~250-byte JSON events over many keys, counted by a
   ``--available-now`` job in 1-minute tumbling windows, end to end (Kafka → Spark state
   → Redis and the Kafka changelog), events per second from the job's start of work to
   the last event accounted for in Redis;
3. latency: events sent open loop at a steady rate with event time = send time; every
   100 ms the benchmark reads how many events the job has accounted for and records how
   long ago the newest of them was sent (event → result visible in Redis).
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from kappaflow.counting.lifecycle import remove
from kappaflow.counting.spec import CountSpec
from kappaflow.counting.store import CountStore
from kappaflow.errors import ConfigError
from kappaflow.jobs.manager import JobManager
from kappaflow.kafka.clients import consumer, producer
from kappaflow.kafka.records import StartAt, produce_with_retry, read_records
from kappaflow.kafka.topics import DEFAULT_PARTITIONS, create_topic, delete_topic, list_topics
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow.waiting import wait_for
from kappaflow_bench.report import machine, percentile, write_json

PAD = "x" * 200  # brings an event to ~250 bytes of JSON


@dataclass
class CountBenchResult:
    events: int
    keys: int
    event_bytes: int
    produce_rate: float = 0.0
    ceiling_spark_rate: float = 0.0
    ceiling_consumer_rate: float = 0.0
    throughput_rate: float = 0.0
    throughput_seconds: float = 0.0
    sustained_rate: float = 0.0
    sustained_seconds: float = 0.0
    latency_rate: int = 0
    latency_seconds: float = 0.0
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    latency_samples: int = 0
    realtime_rate: int = 0
    realtime_seconds: float = 0.0
    realtime_p50_ms: float | None = None
    realtime_p99_ms: float | None = None
    realtime_samples: int = 0
    machine: dict[str, Any] = field(default_factory=dict)


#: Seconds a latency run sends at its rate before it starts measuring.
WARM_SECONDS = 60.0
#: The benchmark's measurements, in the order it runs them; a run may pick some.
MEASUREMENTS = ("ceiling", "throughput", "sustained", "latency", "realtime")


def event(rng: random.Random, n: int, keys: int, ts: int, *, amount: bool = False) -> bytes:
    """Event ``n``: an id, a key drawn from ``rng``, event time ``ts`` (epoch ms) and
    padding; with ``amount``, also a number (0 to 249.75, from ``n``, so that the keys
    drawn stay those of an event without it)."""
    fields: dict[str, object] = {"id": f"e{n}", "key": f"k{rng.randrange(keys)}", "ts": ts}
    if amount:
        fields["amount"] = n % 1000 / 4
    return json.dumps({**fields, "pad": PAD}).encode()


def produce_backlog(
    settings: Settings,
    topic: str,
    events: int,
    keys: int,
    hours_ago: float = 1.0,
    *,
    amount: bool = False,
) -> float:
    """Send ``events`` as fast as possible; event time starts ``hours_ago`` and advances
    1 minute per 100k events. ``amount``: events with a number (see ``event``)."""
    rng = random.Random(1)
    out = producer(
        settings.kafka, **{"linger.ms": 50, "batch.size": 1_000_000, "compression.type": "lz4"}
    )
    origin = int(time.time() * 1000) - int(hours_ago * 3_600_000)
    started = time.perf_counter()
    for n in range(events):
        value = event(rng, n, keys, origin + n * 60_000 // 100_000, amount=amount)
        produce_with_retry(out, topic, value, poll_s=0.05)
    out.flush(120)
    return events / (time.perf_counter() - started)


def ceiling_consumer(settings: Settings, topic: str, events: int) -> float:
    reader = consumer(settings.kafka, **{"fetch.max.bytes": 52_428_800})
    reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in (0, 1)])
    seen = 0
    started = time.perf_counter()
    deadline = started + 600
    while seen < events and time.perf_counter() < deadline:
        for message in reader.consume(10_000, timeout=1.0):
            if message.error() is None:
                seen += 1
    reader.close()
    return seen / (time.perf_counter() - started)


def ceiling_spark(settings: Settings, topic: str) -> float:
    from kappaflow.spark.kafka_io import read_batch
    from kappaflow.spark.session import build_session

    spark = build_session(settings, "kappaflow-bench-ceiling")
    read_batch(spark, settings, topic).count()  # warm up: JIT, connections
    started = time.perf_counter()
    # Touch every value, so that the read is not optimised into offset arithmetic.
    total = (
        read_batch(spark, settings, topic).selectExpr("length(value) AS n").where("n > 0").count()
    )
    elapsed = time.perf_counter() - started
    spark.stop()
    return total / elapsed


def run_count_job(
    settings: Settings,
    name: str,
    topic: str,
    available_now: bool,
    overrides: SettingsOverrides,
    realtime: bool = False,
) -> tuple[JobManager, float]:
    spec = CountSpec(
        source=topic,
        key_field="key",
        time_field="ts",
        window_ms=60_000,
        watermark_ms=10_000,
        allowed_lateness_ms=0,
        available_now=available_now,
        realtime=realtime,
    )
    jobs = JobManager(settings)
    jobs.start(name, "count", spec.to_params(), overrides=overrides)
    return jobs, time.perf_counter()


def processed(store: CountStore) -> int:
    return store.stats().accounted


def measure_throughput(
    settings: Settings,
    topic: str,
    events: int,
    overrides: SettingsOverrides,
    on_done: Callable[[str], None] | None = None,
) -> tuple[float, float]:
    """Events/s of a new ``--available-now`` count job over the backlog in ``topic``.
    ``on_done`` gets the job's name before the job and what it wrote are removed."""
    name = f"bench-count-{uuid.uuid4().hex[:6]}"
    store = CountStore(redis_client(settings), name)
    jobs, started = run_count_job(settings, name, topic, True, overrides)
    wait_for(
        lambda: True if processed(store) >= events else None,
        timeout=3600,
        interval=0.5,
        what="the backlog to be counted",
    )
    elapsed = time.perf_counter() - started
    if on_done is not None:
        on_done(name)
    if jobs.get_state(name) == "running":
        jobs.stop(name)
    clean_up(settings, [], [name])
    return events / elapsed, elapsed


def measure_sustained(
    settings: Settings, events: int, keys: int, overrides: SettingsOverrides
) -> tuple[float, float]:
    """A running, warmed-up job fed ``events`` as fast as the producer goes: events/s from
    the first send to the last event accounted for in Redis.

    The warm-up (a fifth as many events, earlier in event time) pays for what a new job
    pays once: the JIT, the Python workers, opening the state store."""
    topic = f"bench.sustained.{uuid.uuid4().hex[:6]}"
    create_topic(settings.kafka, topic, partitions=DEFAULT_PARTITIONS)
    name = f"bench-sustained-{uuid.uuid4().hex[:6]}"
    store = CountStore(redis_client(settings), name)
    jobs, _ = run_count_job(settings, name, topic, False, overrides)
    warm = max(1, events // 5)
    try:
        produce_backlog(settings, topic, warm, keys, hours_ago=2.0)
        wait_for(
            lambda: True if processed(store) >= warm else None,
            timeout=1800,
            interval=0.5,
            what="the warm-up to be counted",
        )
        started = time.perf_counter()
        produce_backlog(settings, topic, events, keys, hours_ago=1.0)
        wait_for(
            lambda: True if processed(store) >= warm + events else None,
            timeout=3600,
            interval=0.2,
            what="the events to be counted",
        )
        elapsed = time.perf_counter() - started
    finally:
        jobs.stop(name)
        clean_up(settings, [topic], [name])
    return events / elapsed, elapsed


def measure_latency(
    settings: Settings,
    rate: int,
    seconds: float,
    keys: int,
    overrides: SettingsOverrides,
    warm_seconds: float = WARM_SECONDS,
) -> list[float]:
    """Seconds from sending an event to its count in Redis, sampled every 100 ms at a
    steady ``rate``, after ``warm_seconds`` at that rate.

    The warm-up is what any running job is past: the JVM compiling Spark's code (on two
    cores its JIT is busy for a minute or more), the Python workers, the state store."""
    topic = f"bench.latency.{uuid.uuid4().hex[:6]}"
    create_topic(settings.kafka, topic, partitions=DEFAULT_PARTITIONS)
    name = f"bench-latency-{uuid.uuid4().hex[:6]}"
    store = CountStore(redis_client(settings), name)
    jobs, _ = run_count_job(settings, name, topic, False, overrides)
    rng = random.Random(2)
    first = producer(settings.kafka)
    first.produce(topic, value=event(rng, -1, keys, int(time.time() * 1000)))
    first.flush(30)
    wait_for(
        lambda: True if processed(store) >= 1 else None,
        timeout=300,
        interval=0.2,
        what="the latency job's first batch",
    )
    base = processed(store)
    out = producer(settings.kafka)
    sent_at: list[float] = []
    samples: list[float] = []
    started = time.perf_counter()
    next_probe = started + warm_seconds
    try:
        while (now := time.perf_counter()) - started < warm_seconds + seconds:
            due = int((now - started) * rate) - len(sent_at)
            stamp = int(time.time() * 1000)
            for _ in range(max(0, due)):
                produce_with_retry(out, topic, event(rng, len(sent_at), keys, stamp), poll_s=0.05)
                sent_at.append(time.perf_counter())
            out.poll(0)
            if now >= next_probe:
                done = processed(store) - base
                if done > 0:
                    samples.append(time.perf_counter() - sent_at[min(done, len(sent_at)) - 1])
                next_probe = now + 0.1
            time.sleep(0.001)
    finally:
        out.flush(30)
        jobs.stop(name)
        clean_up(settings, [topic], [name])
    return samples


def send_steadily(
    settings: Settings, topic: str, rate: int, seconds: float, keys: int, seed: int
) -> int:
    """Open loop: events due by now are sent now, each with event time = its send time."""
    rng = random.Random(seed)
    out = producer(settings.kafka, **{"linger.ms": 1})
    sent = 0
    started = time.perf_counter()
    while (now := time.perf_counter()) - started < seconds:
        due = int((now - started) * rate) - sent
        stamp = int(time.time() * 1000)
        for _ in range(max(0, due)):
            produce_with_retry(out, topic, event(rng, sent, keys, stamp), poll_s=0.05)
            sent += 1
        out.poll(0)
        time.sleep(0.001)
    out.flush(30)
    return sent


def measure_realtime_latency(
    settings: Settings, rate: int, seconds: float, keys: int, overrides: SettingsOverrides
) -> list[float]:
    """Event → changelog latency of the real-time path, in milliseconds.

    For each real-time record: its Kafka timestamp (set when Spark's sink sends it)
    minus the newest event time it includes (the event that changed the count, whose
    event time is its send time)."""
    topic = f"bench.realtime.{uuid.uuid4().hex[:6]}"
    create_topic(settings.kafka, topic, partitions=DEFAULT_PARTITIONS)
    name = f"bench-realtime-{uuid.uuid4().hex[:6]}"
    jobs, _ = run_count_job(settings, name, topic, False, overrides, realtime=True)
    try:
        # Warm up: the first records pay for the long-running tasks' start.
        send_steadily(settings, topic, 100, 5.0, keys, seed=3)
        wait_for(
            lambda: True if _realtime_records(settings, name, 0) else None,
            timeout=120,
            what="the first real-time counts",
        )
        # Then the rate itself, for as long as the micro-batch latency run warms up.
        send_steadily(settings, topic, rate, WARM_SECONDS, keys, seed=4)
        measured_from = int(time.time() * 1000)
        send_steadily(settings, topic, rate, seconds, keys, seed=5)
        samples = [
            float(stamp - latest)
            for stamp, latest in _realtime_records(settings, name, measured_from)
        ]
    finally:
        jobs.stop(name)
        clean_up(settings, [topic], [name])
    return samples


def _realtime_records(settings: Settings, job: str, since_ms: int) -> list[tuple[int, int]]:
    """(Kafka timestamp, newest event time) of real-time records with events since then."""
    from datetime import datetime

    found: list[tuple[int, int]] = []
    for message in read_records(settings.kafka, f"{job}.counts", start=StartAt(beginning=True)):
        value = json.loads(message.value() or b"{}")
        if value.get("mode") != "realtime":
            continue
        latest = int(datetime.fromisoformat(value["latest_event"]).timestamp() * 1000)
        if latest >= since_ms:
            found.append((message.timestamp()[1], latest))
    return found


def clean_up(settings: Settings, topics: list[str], jobs: list[str]) -> None:
    """Drop what a benchmark created: its topics, and its jobs with all they wrote."""
    for job in jobs:
        remove(settings, job, missing_ok=True)
    existing = {t["name"] for t in list_topics(settings.kafka)}
    for topic in topics:
        if topic in existing:
            delete_topic(settings.kafka, topic)


def run(
    settings: Settings,
    *,
    events: int,
    keys: int,
    latency_rate: int,
    latency_seconds: float,
    out_dir: Path,
    overrides: SettingsOverrides,
    measure: tuple[str, ...] = MEASUREMENTS,
) -> CountBenchResult:
    """The measurements named in ``measure`` (all by default); the others stay empty."""
    unknown = sorted(set(measure) - set(MEASUREMENTS))
    if unknown:
        raise ConfigError(f"unknown measurements {unknown}; known: {', '.join(MEASUREMENTS)}")
    result = CountBenchResult(
        events=events, keys=keys, event_bytes=len(event(random.Random(0), 0, keys, 0))
    )
    result.machine = {**machine(), "measured": list(measure)}
    if "ceiling" in measure or "throughput" in measure:
        topic = f"bench.count.{uuid.uuid4().hex[:6]}"
        create_topic(settings.kafka, topic, partitions=DEFAULT_PARTITIONS)
        result.produce_rate = produce_backlog(settings, topic, events, keys)
        if "ceiling" in measure:
            result.ceiling_consumer_rate = ceiling_consumer(settings, topic, events)
            result.ceiling_spark_rate = ceiling_spark(settings, topic)
        if "throughput" in measure:
            result.throughput_rate, result.throughput_seconds = measure_throughput(
                settings, topic, events, overrides
            )
        clean_up(settings, [topic], [])
    if "sustained" in measure:
        result.sustained_rate, result.sustained_seconds = measure_sustained(
            settings, events, keys, overrides
        )
    samples: list[float] = []
    if "latency" in measure:
        samples = measure_latency(settings, latency_rate, latency_seconds, keys, overrides)
        result.latency_rate, result.latency_seconds = latency_rate, latency_seconds
        result.latency_samples = len(samples)
        result.latency_p50_s = percentile(samples, 50)
        result.latency_p99_s = percentile(samples, 99)
    realtime_ms: list[float] = []
    if "realtime" in measure:
        realtime_ms = measure_realtime_latency(
            settings, latency_rate, latency_seconds, keys, overrides
        )
        result.realtime_rate, result.realtime_seconds = latency_rate, latency_seconds
        result.realtime_samples = len(realtime_ms)
        result.realtime_p50_ms = percentile(realtime_ms, 50)
        result.realtime_p99_ms = percentile(realtime_ms, 99)
    result.machine["load_average_at_end"] = os.getloadavg()
    write_json(out_dir / "result.json", result)
    if samples:
        (out_dir / "latency.txt").write_text("".join(f"{s:.4f}\n" for s in samples))
    if realtime_ms:
        (out_dir / "realtime-latency-ms.txt").write_text("".join(f"{s:.0f}\n" for s in realtime_ms))
    return result

"""The round-trip demo: a clickstream into Kafka, a Spark job cleaning it, results live.

It starts the embedded services, creates the topics, starts the ``clean`` job as a
process of its own, sends page views (about 2% of them malformed) at a steady rate, and
shows what reaches the output and dead-letter topics. At the end, or on Ctrl-C, it stops
the job and the services it started.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from kappaflow import services
from kappaflow.kafka.clients import consumer, producer
from kappaflow.kafka.topics import create_topic
from kappaflow.procs import ProcState
from kappaflow.settings import Settings
from kappaflow.spark.jobs import JobManager

SOURCE, DEST, JOB = "demo.clicks", "demo.clicks.clean", "demo-clean"
PAGES = ["/", "/search", "/cart", "/checkout", *(f"/products/{n}" for n in range(20))]


@dataclass
class Counters:
    sent: int = 0
    malformed: int = 0


def click_event(rng: random.Random) -> bytes:
    """One page view; event time is when it happened, a little before it is sent."""
    happened = int(time.time() * 1000) - rng.randint(0, 3000)
    event = {"user": f"u{rng.randint(1, 500)}", "page": rng.choice(PAGES), "ts": happened}
    if rng.random() < 0.02:
        return json.dumps(event).encode()[:-7]  # cut short, as a crashed client would
    return json.dumps(event).encode()


def run_demo(
    settings: Settings,
    *,
    seconds: float,
    rate: int,
    console: Console,
    overrides: dict[str, Any] | None = None,
    config_file: Path | None = None,
) -> None:
    """Run the demo for ``seconds``; ``overrides`` and ``config_file`` reach the job."""
    before = {row.service: row.state for row in services.status(settings)}
    for line in services.up(settings):
        console.print(line)
    jobs = JobManager(settings)
    try:
        for topic in (SOURCE, DEST):
            create_topic(settings.kafka, topic, partitions=2, exist_ok=True)
        console.print(f"starting Spark job {JOB} ({SOURCE} -> {DEST}) …")
        if jobs.get_state(JOB) != "running":
            jobs.start(
                JOB,
                "clean",
                {"source": SOURCE, "dest": DEST},
                overrides=overrides,
                config_file=config_file,
            )
        _stream(settings, jobs, seconds=seconds, rate=rate, console=console)
    except KeyboardInterrupt:
        console.print("interrupted")
    finally:
        if jobs.get_state(JOB) == "running":
            jobs.stop(JOB)
            console.print(f"job {JOB} stopped")
        started_here = [s for s, state in before.items() if state == ProcState.STOPPED.value]
        if started_here:
            for line in services.down(settings):
                console.print(line)


def _stream(
    settings: Settings, jobs: JobManager, *, seconds: float, rate: int, console: Console
) -> None:
    rng = random.Random(7)
    counters = Counters()
    out = producer(settings.kafka)
    reader = consumer(settings.kafka)
    latest: list[dict[str, Any]] = []
    reader.assign([TopicPartition(DEST, p) for p in (0, 1)])
    # The topics outlive a demo run: count only what this run adds.
    baseline = _counts(reader)
    started = time.monotonic()
    with Live(console=console, refresh_per_second=2) as live:
        while (elapsed := time.monotonic() - started) < seconds:
            # Open loop: send what the schedule says by now, whatever the job does.
            due = int(elapsed * rate) - counters.sent
            for _ in range(max(0, due)):
                value = click_event(rng)
                out.produce(SOURCE, value=value)
                counters.sent += 1
                counters.malformed += not value.endswith(b"}")
            out.poll(0)
            for message in reader.consume(500, timeout=0.1):
                if message.error() is None and message.value():
                    latest = ([json.loads(message.value() or b"{}"), *latest])[:6]
            counts = {t: n - baseline.get(t, 0) for t, n in _counts(reader).items()}
            if not latest and counts[DEST]:
                # Assigned before the job created any output: start over from the beginning.
                reader.assign([TopicPartition(DEST, p, OFFSET_BEGINNING) for p in (0, 1)])
            live.update(_view(jobs, counters, latest, elapsed, counts))
    out.flush(10)
    reader.close()


def _view(
    jobs: JobManager,
    counters: Counters,
    latest: list[dict[str, Any]],
    elapsed: float,
    counts: dict[str, int],
) -> Group:
    progress = jobs.progress(JOB).get(JOB) or {}
    summary = Table(title=f"kappaflow demo: {elapsed:4.0f}s", title_justify="left")
    for column in ("sent", "malformed", "job", "batch", "in/s", "out/s", "cleaned", "dead letters"):
        summary.add_column(column, justify="right")
    summary.add_row(
        str(counters.sent),
        str(counters.malformed),
        jobs.get_state(JOB),
        str(progress.get("batchId", "-")),
        f"{progress.get('inputRowsPerSecond', 0):.0f}",
        f"{progress.get('processedRowsPerSecond', 0):.0f}",
        str(counts.get(DEST, 0)),
        str(counts.get(f"{JOB}.dlq", 0)),
    )
    recent = Table(title=f"latest events in {DEST}", title_justify="left")
    for column in ("user", "page", "event time"):
        recent.add_column(column)
    for event in latest:
        stamp = datetime.fromtimestamp(int(event.get("ts", 0)) / 1000, tz=UTC)
        recent.add_row(
            str(event.get("user")), str(event.get("page")), stamp.strftime("%H:%M:%S.%f")[:-3]
        )
    return Group(summary, recent)


def _counts(reader: Any) -> dict[str, int]:
    """Records in the output and dead-letter topics (the job creates the latter)."""
    counts: dict[str, int] = {}
    for topic in (DEST, f"{JOB}.dlq"):
        total = 0
        for partition in (0, 1):
            try:
                low, high = reader.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=1.0, cached=False
                )
            except Exception:  # the topic or partition does not exist (yet)
                continue
            total += high - low
        counts[topic] = total
    return counts

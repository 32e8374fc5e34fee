"""The demo: page views flow into Kafka, a counting job counts them per page per minute.

It starts the embedded services, starts the ``count`` job as a process of its own, and
sends a generated clickstream: events a little out of order, about 1% sent twice, 0.5%
hopelessly late, 0.5% malformed. Event time runs on a time-lapse clock (a minute of
event time every five seconds by default) so windows close while you watch. The terminal
shows the latest windows' provisional and final counts from Redis, with the job's
counters, watermark and end-to-end latency. At the end, or on Ctrl-C, it stops the job
and the services it started.
"""

from __future__ import annotations

import json
import random
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from kappaflow import services
from kappaflow.counting import lifecycle
from kappaflow.counting.spec import CountSpec
from kappaflow.counting.store import CountStore, WindowCount
from kappaflow.jobs.manager import ACTIVE_STATES, JobManager
from kappaflow.kafka.clients import producer
from kappaflow.kafka.topics import DEFAULT_PARTITIONS, create_topic, delete_topic, list_topics
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow.timeutil import from_epoch_ms

SOURCE, JOB = "demo.pageviews", "demo-views"
#: How long the demo waits, after it stops sending, for the job to catch up.
DRAIN_SECONDS = 90.0
PAGES = ["/", "/search", "/cart", "/checkout", *(f"/products/{n}" for n in range(12))]
SPEC = CountSpec(
    source=SOURCE,
    key_field="page",
    time_field="ts",
    id_field="id",
    window_ms=60_000,
    watermark_ms=30_000,
    allowed_lateness_ms=120_000,
)


@dataclass
class Clickstream:
    """Page views on a time-lapse event clock, with the faults real streams have."""

    speedup: float
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    started: float = field(default_factory=time.monotonic)
    origin_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    sent: int = 0
    recent: list[bytes] = field(default_factory=list)

    def now_ms(self) -> int:
        return self.origin_ms + int((time.monotonic() - self.started) * 1000 * self.speedup)

    def next(self) -> bytes:
        self.sent += 1
        roll = self.rng.random()
        if roll < 0.01 and self.recent:
            return self.rng.choice(self.recent)  # a producer retry: same id again
        if roll < 0.015:
            return b'{"page": "/cart", "ts": '  # a client that died mid-write
        delay = 300_000 if roll < 0.02 else int(self.rng.expovariate(1 / 4000))
        event = {
            "id": f"v{self.sent}",
            "page": self.rng.choice(PAGES),
            "user": f"u{self.rng.randint(1, 2000)}",
            "ts": self.now_ms() - delay,
        }
        raw = json.dumps(event).encode()
        self.recent = [*self.recent[-50:], raw]
        return raw


def run_demo(
    settings: Settings,
    *,
    seconds: float,
    rate: int,
    console: Console,
    speedup: float = 12.0,
    overrides: SettingsOverrides | None = None,
    config_file: Path | None = None,
) -> None:
    """Run the demo for ``seconds``; ``overrides`` and ``config_file`` reach the job."""
    # Only the services the demo starts are stopped at its end.
    with services.embedded_services(settings, console.print):
        jobs = JobManager(settings)
        try:
            _reset(settings, jobs)
            create_topic(settings.kafka, SOURCE, partitions=DEFAULT_PARTITIONS, exist_ok=True)
            console.print(f"starting counting job {JOB}: views per page per minute of {SOURCE} …")
            jobs.start(JOB, "count", SPEC.to_params(), overrides=overrides, config_file=config_file)
            _stream(settings, jobs, seconds=seconds, rate=rate, speedup=speedup, console=console)
        except KeyboardInterrupt:
            console.print("interrupted")
        finally:
            # Also a job interrupted while it started: its driver must not outlive the demo.
            if jobs.get_state(JOB) in ACTIVE_STATES:
                jobs.stop(JOB)
                console.print(f"job {JOB} stopped")


def _reset(settings: Settings, jobs: JobManager) -> None:
    """Start from nothing: the time-lapse clock must not run into an old watermark."""
    if jobs.get_state(JOB) in ACTIVE_STATES:
        jobs.stop(JOB)
    lifecycle.remove(settings, JOB, missing_ok=True)
    if SOURCE in {row["name"] for row in list_topics(settings.kafka)}:
        delete_topic(settings.kafka, SOURCE)


def _stream(
    settings: Settings,
    jobs: JobManager,
    *,
    seconds: float,
    rate: int,
    speedup: float,
    console: Console,
) -> None:
    clicks = Clickstream(speedup)
    out = producer(settings.kafka)
    store = CountStore(redis_client(settings), JOB)
    sent_at: list[tuple[float, int]] = []
    done_at: list[tuple[float, int]] = []
    started = time.monotonic()
    next_view = 0.0
    with Live(console=console, refresh_per_second=2) as live:
        while (elapsed := time.monotonic() - started) < seconds:
            # Open loop: send what the schedule says by now, whatever the job does.
            for _ in range(max(0, int(elapsed * rate) - clicks.sent)):
                out.produce(SOURCE, value=clicks.next())
            out.poll(0)
            sent_at.append((time.monotonic(), clicks.sent))
            if elapsed >= next_view:
                live.update(_view(store, jobs, clicks, sent_at, done_at, elapsed))
                next_view = elapsed + 0.5
            time.sleep(0.02)
        out.flush(10)
        # Then let the job catch up, so the last view shows every event sent and the
        # windows its watermark closed; a slow machine's job may be seconds behind.
        deadline = time.monotonic() + DRAIN_SECONDS
        while time.monotonic() < deadline and not _caught_up(store, clicks.sent):
            live.update(_view(store, jobs, clicks, sent_at, done_at, time.monotonic() - started))
            time.sleep(0.5)
        live.update(_view(store, jobs, clicks, sent_at, done_at, time.monotonic() - started))


def _caught_up(store: CountStore, sent: int) -> bool:
    """Whether the job has accounted for every event sent and made a window final."""
    return store.stats().accounted >= sent and any(w.final for w in store.windows())


def live_columns(windows: list[WindowCount]) -> list[int]:
    """Three window starts: the newest final window and the two after it, if any.

    The newest windows are still open when the job catches up, so the table would show
    no final count if it showed only them.
    """
    starts = sorted({w.window_start for w in windows})
    finals = [w.window_start for w in windows if w.final]
    first = starts.index(max(finals)) if finals else len(starts)
    return starts[max(0, min(first, len(starts) - 3)) :][:3]


def _view(
    store: CountStore,
    jobs: JobManager,
    clicks: Clickstream,
    sent_at: list[tuple[float, int]],
    done_at: list[tuple[float, int]],
    elapsed: float,
) -> Group:
    stats = store.stats()
    processed = stats.accounted
    # The job's rate: events accounted for over the last five seconds or so.
    now = time.monotonic()
    done_at.append((now, processed))
    while len(done_at) > 2 and now - done_at[1][0] >= 5.0:
        done_at.pop(0)
    then, before = done_at[0]
    rate = f"{(processed - before) / (now - then):,.0f}/s" if now > then else "-"
    # End-to-end latency: how long ago the newest processed event was sent.
    index = bisect_left([count for _, count in sent_at], processed) if processed else None
    latency = (
        f"{time.monotonic() - sent_at[index][0]:.1f}s"
        if index is not None and index < len(sent_at)
        else "-"
    )
    watermark = stats.watermark_ms
    head = Table(
        title=f"kappaflow demo: {elapsed:3.0f}s, job {jobs.get_state(JOB)}", title_justify="left"
    )
    for column in ("sent", "rate", "counted", "dups", "late", "dlq", "watermark", "latency"):
        head.add_column(column, justify="right")
    head.add_row(
        str(clicks.sent),
        rate,
        str(stats.counted),
        str(stats.duplicates),
        str(stats.late),
        str(stats.dead_letters),
        from_epoch_ms(watermark).strftime("%H:%M:%S") if watermark else "-",
        latency,
    )
    windows = list(store.windows())
    starts = live_columns(windows)
    grid = Table(title="views per page per minute (event time; ✓ final)", title_justify="left")
    grid.add_column("page")
    for start in starts:
        grid.add_column(from_epoch_ms(start).strftime("%H:%M"), justify="right")
    cells = {(w.key, w.window_start): w for w in windows}
    busiest = sorted(
        PAGES, key=lambda p: -sum(cells[(p, s)].count for s in starts if (p, s) in cells)
    )[:8]
    for page in busiest:
        row = [page]
        for start in starts:
            cell = cells.get((page, start))
            row.append(f"{cell.count}{' ✓' if cell.final else '  '}" if cell else "")
        grid.add_row(*row)
    return Group(head, grid)
